"""KServe's Python model server serving one ONNX file with ONNX Runtime (KServe's
``kserve`` package ships no ONNX runtime of its own).

    python kserve_onnx.py --model_name NAME --onnx PATH --http_port PORT [--threads 1]

Everything else on the command line goes to KServe's own argument parser
(``kserve.model_server``), which ``benchmarks/peers.py`` uses for ``--workers 1`` and
``--enable_grpc false`` and ``--enable_latency_logging false``; the per-request loggers
(uvicorn's access log, KServe's timing trace) are lowered to WARNING, since a tierlink node
logs nothing per request either. Each request: the inputs as numpy arrays, one ``session.run``
inline on the event loop (a synchronous ``predict``: KServe calls it directly), every
output back, binary when the request asks for binary outputs, as the node does.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import kserve
from kserve import InferOutput, InferRequest, InferResponse
from ort_session import open_session


class OnnxModel(kserve.Model):
    def __init__(self, name: str, path: str, threads: int) -> None:
        super().__init__(name)
        self._path = path
        self._threads = threads
        self.load()

    def load(self) -> bool:
        self._session = open_session(self._path, self._threads)
        self._outputs = [o.name for o in self._session.get_outputs()]
        self.ready = True
        return self.ready

    def predict(self, payload: InferRequest, headers: Any = None,
                response_headers: Any = None) -> InferResponse:
        feed = {i.name: i.as_numpy() for i in payload.inputs}
        values = self._session.run(None, feed)
        outputs = []
        for name, value in zip(self._outputs, values):
            out = InferOutput(name=name, shape=list(value.shape), datatype=_datatype(value))
            out.set_data_from_numpy(value, binary_data=payload.use_binary_outputs)
            outputs.append(out)
        return InferResponse(response_id=payload.id, model_name=self.name,
                             infer_outputs=outputs, use_binary_outputs=payload.use_binary_outputs,
                             requested_outputs=payload.request_outputs)


def _datatype(value: Any) -> str:
    from kserve.utils.numpy_codec import from_np_dtype

    return str(from_np_dtype(value.dtype))


def main() -> None:
    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser], add_help=False)
    parser.add_argument("--onnx", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args, _ = parser.parse_known_args()
    server = kserve.ModelServer()  # configures KServe's logging
    for name in ("uvicorn.access", "kserve.trace"):
        logging.getLogger(name).setLevel(logging.WARNING)
    server.start([OnnxModel(args.model_name, args.onnx, args.threads)])


if __name__ == "__main__":
    main()
