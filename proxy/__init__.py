"""The stateless client-facing proxy serving `apache.rocketmq.v2.MessagingService`."""
