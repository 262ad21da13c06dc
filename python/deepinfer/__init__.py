"""DeepInfer: an inference engine for DeepSeek V2/V3 models (C++ core, paged latent cache, Python front door)."""

from deepinfer._nccl import configure_nccl_library
from deepinfer.config import EngineConfig, QuantizationConfig
from deepinfer.engine import DeepInferenceEngine, RequestStream
from deepinfer.llm import LLM
from deepinfer.outputs import CompletionOutput, RequestOutput
from deepinfer.sampling_params import SamplingParams
from deepinfer.structured_outputs import StructuredOutputsParams
from deepinfer.tokenizer import Tokenizer

# The engine opens NCCL only when it makes a GPU communicator, from the path this sets when the NCCL wheel is there.
configure_nccl_library()

__version__ = "0.1.0"

__all__ = [
    "DeepInferenceEngine",
    "LLM",
    "EngineConfig",
    "QuantizationConfig",
    "SamplingParams",
    "StructuredOutputsParams",
    "RequestOutput",
    "CompletionOutput",
    "RequestStream",
    "Tokenizer",
    "__version__",
]
