"""The consumer-group coordinator: state machine, assignors and its gRPC adapter."""
