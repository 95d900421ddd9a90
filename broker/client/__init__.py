"""The broker contract and its client side: `BrokerApi` and its dataclasses (`api`), the gRPC
client of a remote broker (`remote`) and its wire conversion (`grpc_convert`), and the codecs of
the opaque handles clients hold (`handles`, `receipt`, `txid`).

Nothing here imports the storage node (the rest of `broker/`): the proxy imports only this package.
"""
