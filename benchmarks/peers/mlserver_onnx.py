"""An MLServer runtime serving one ONNX file with ONNX Runtime (MLServer ships none).

``model-settings.json`` names it (``"implementation": "mlserver_onnx.OnnxRuntime"``), gives
the file as ``parameters.uri`` and the intra-op threads as ``parameters.extra.threads``;
``benchmarks/peers.py`` writes those files and puts this folder on ``PYTHONPATH``. Each
request: decode the inputs, one ``session.run`` inline on the event loop (MLServer's own
runtimes do the same when parallel inference is off), every output back, as the node does.
"""

from __future__ import annotations

from typing import Any

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from ort_session import open_session


class OnnxRuntime(MLModel):
    async def load(self) -> bool:
        params = self.settings.parameters
        extra: dict[str, Any] = (params.extra or {}) if params else {}
        self._session = open_session(str(params.uri), int(extra.get("threads", 1)))
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feed = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        values = self._session.run(None, feed)
        return InferenceResponse(
            model_name=self.name, id=payload.id,
            outputs=[NumpyCodec.encode_output(n, v) for n, v in zip(self._outputs, values)])
