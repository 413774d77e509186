"""TF Serving warm-up requests: PredictionLog records written without tensorflow_serving.

TF Serving replays `assets.extra/tf_serving_warmup_requests` (a TFRecord
file of `tensorflow.serving.PredictionLog` protos) when it loads a model,
so the first real request does not pay for compilation. The
tensorflow-serving-api package is not a dependency (its pins fight
TensorFlow's), and the few messages a Predict warm-up needs are small, so
this module writes their protobuf wire format itself:

    PredictionLog   { PredictLog predict_log = 6; }
    PredictLog      { PredictRequest request = 1; }
    PredictRequest  { ModelSpec model_spec = 1; map<string, TensorProto> inputs = 2; }
    ModelSpec       { string name = 1; string signature_name = 3; }
    map entry       { string key = 1; TensorProto value = 2; }

(field numbers from tensorflow_serving/apis/{prediction_log,predict,model}.proto).
Every field written is length-delimited (wire type 2); the TensorProto
values come already serialized (tf.make_tensor_proto(...).SerializeToString()).
"""

from __future__ import annotations

from collections.abc import Mapping

FILE = "tf_serving_warmup_requests"
DIR = "assets.extra"

_LENGTH_DELIMITED = 2


def varint(n: int) -> bytes:
  """Protobuf base-128 varint of a non-negative int."""
  if n < 0:
    raise ValueError(f"varint of a negative number {n}")
  out = bytearray()
  while True:
    low = n & 0x7F
    n >>= 7
    if n:
      out.append(low | 0x80)
    else:
      out.append(low)
      return bytes(out)


def field(number: int, payload: bytes) -> bytes:
  """One length-delimited field (a string, bytes or an embedded message)."""
  return varint(number << 3 | _LENGTH_DELIMITED) + varint(len(payload)) + payload


def predict_log(signature_name: str, inputs: Mapping[str, bytes], model_name: str = "") -> bytes:
  """A serialized PredictionLog holding one Predict request.

  Args:
    signature_name: the SavedModel signature the request calls.
    inputs: input name -> serialized TensorProto.
    model_name: ModelSpec.name (TF Serving's warm-up does not read it; empty leaves it out).
  """
  spec = (field(1, model_name.encode()) if model_name else b"") + field(
      3, signature_name.encode())
  request = field(1, spec) + b"".join(
      field(2, field(1, name.encode()) + field(2, tensor))
      for name, tensor in sorted(inputs.items()))
  return field(6, field(1, request))
