"""The AMQP 0-9-1 gateway of the proxy (docs/amqp.md): RabbitMQ's clients over the same brokers."""
