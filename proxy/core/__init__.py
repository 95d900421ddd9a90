"""Protocol-free proxy logic: works on the broker API's dataclasses, never on protobuf."""
