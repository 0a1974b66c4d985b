"""The runtime: validated inputs, the model wrapper, ONNX Runtime, engines, batch sizes, schedules and incremental inference."""
