"""The MQTT 3.1.1 and 5.0 gateway of the proxy (docs/mqtt.md)."""
