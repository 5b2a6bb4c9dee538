"""The broker: the gRPC service, start-up, config, embedded broker and coordinators."""
