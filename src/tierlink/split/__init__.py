"""tierlink.split: split computing — cut an ONNX model into a head (runs on the device) and a
tail (runs upstream), and move the one tensor between them as a compact, versioned payload.

``partition``: :func:`~tierlink.split.partition.cut_points` lists every single-tensor cut of a
model, :func:`~tierlink.split.partition.split_model` writes the head and tail of one.
``codecs``: feature codecs (fp32, fp16, int8, int8c, topk:R, thr:T, each optionally +zstd)
with a pickle-free wire format; :func:`~tierlink.split.codecs.get_codec`,
:func:`~tierlink.split.codecs.decode_any`.

Importing this package loads nothing (onnx, numpy and zstandard load with the submodules).
"""
