"""Names `make deadcode` (vulture) must not report: used, but in ways vulture cannot see.

Each entry says why. Dead code is deleted, never listed here. Format: vulture's whitelist (a name,
or `_.attribute`, is a use of it).
"""

# ruff: noqa
# mypy: ignore-errors

# gRPC servicer methods: grpc calls them by the service's method names.
_.RegisterBroker, _.UnregisterBroker, _.GetRoute, _.ListBrokers  # nameserver/service.py
_.RegisterProxy, _.UnregisterProxy, _.GetEndpoints, _.ListProxies  # navigation/service.py
_.QueryAssignment, _.ForwardMessageToDeadLetterQueue, _.PullMessage, _.NotifyClientTermination  # proxy
# broker/service.py: proto/h2rpc.py serves a servicer's methods by the service's method names.
_.CreateTopic, _.UpdateTopic, _.DeleteTopic, _.GetTopic, _.ListTopics, _.CreateGroup, _.UpdateGroup, _.DeleteGroup
_.GetGroup, _.ListGroups, _.Pop, _.Renew, _.ForwardToDeadLetter, _.Pull, _.QueryOffset, _.ReadRows, _.GetMessage
_.FindMessagesByKey, _.ClaimTransactionChecks, _.MessageTrace, _.TierUploadNow, _.TierEvictLocal, _.GetSecurity
_.PutSecurity, _.GetAmqpMeta, _.PutAmqpMeta, _.Recall, _.ResetOffset, _.ReportClients, _.ListClients
_.MqttGet, _.MqttWrite, _.MqttScan
_.ListLiteTopics, _.ClaimLiteRemovals

# Protobuf fields set for the wire (vulture sees a store to an attribute nobody reads).
_.checksum, _.on, _.validate_message_type, _.lite_topic, _.priority
_.lite_subscription_quota, _.max_lite_topic_size

# Framework hooks and protocols called by name.
_.pushFilters  # Spark's DataSourceReader
_.streamReader, _.streamWriter, _.initialOffset, _.getDefaultReadLimit, _.prepareForTriggerAvailableNow  # Spark
_.latestOffset, _.reportLatestOffset  # Spark's DataSourceStreamReader
_.seekable, _.readinto  # io.RawIOBase, read by pyarrow
_.log_request  # http.server.BaseHTTPRequestHandler (tests/helpers/s3.py)
_.required  # argparse subparsers (sluice/main.py)
_.STUB  # a ServerSetClient's gRPC stub, read by proto/servers.py (outside vulture's paths)
observe_internal_rpc  # common/metrics.py: called by proto/rpc.py and proto/h2rpc.py (outside vulture's paths)
_.teardown  # hypothesis RuleBasedStateMachine
NONE  # common.model.Permission: the wire enum's value 1
updated_at  # cluster/state.py: written to the state file for operators

ProxyTimeout  # common.errors: the class of the wire code PROXY_TIMEOUT (error_for_code rebuilds it)

_.deleted_segments, dispatch_max_lag_ms  # broker/store: set, never read

_.connection_made, _.connection_lost, _.data_received  # asyncio.Protocol (common/http2/server.py, client.py)
_.pause_writing, _.resume_writing  # asyncio.Protocol flow control (common/http2/server.py)
_.header_table_size  # hpack.Encoder setting (tests/unit/test_http2_hostile.py)
# RFC 9113's error codes, named for the codes a peer may send us (common/http2/frames.py)
SETTINGS_TIMEOUT, CONNECT_ERROR, INADEQUATE_SECURITY, HTTP_1_1_REQUIRED
# gRPC's status codes, named for the codes a server may send us (common/http2/grpcwire.py)
ALREADY_EXISTS, ABORTED, OUT_OF_RANGE, DATA_LOSS

# paho-mqtt (tests/e2e/support/mqtt.py, the MQTT e2e tests): callbacks and MQTT 5 properties are set
# as attributes the library reads.
_.on_connect, _.on_subscribe, _.on_unsubscribe, _.on_disconnect
_.SessionExpiryInterval, _.SubscriptionIdentifier, _.WillDelayInterval, _.ContentType, _.ResponseTopic
_.CorrelationData, _.PayloadFormatIndicator, _.MessageExpiryInterval, _.UserProperty
