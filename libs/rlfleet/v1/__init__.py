"""Generated protobuf/gRPC stubs of protos/rlfleet/v1 (`make proto`); never edit by hand."""
