"""Users' own models: ``tierlink model import`` measures an ONNX model on its labelled data,
writes its card and installs it in the local model store, where fleets find it by name."""
