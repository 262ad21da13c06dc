"""DeepInferenceEngine: the Python front door over the C++ engine.

The C++ step loop runs in its own thread. A dispatcher thread here waits for its outputs (without the GIL while
it waits), detokenizes them incrementally, applies stop strings, and hands each request's updates to its
RequestStream, which a caller iterates synchronously, asynchronously (the server), or collects (generate()).
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import os
import queue
import random
import signal
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Protocol, Union

from deepinfer import _deepinfer
from deepinfer.config import EngineConfig, WeightFormat, resolve_weight_format
from deepinfer.default_model import default_model
from deepinfer.generation_defaults import load_generation_defaults
from deepinfer.launch import RankPlacement, configure_options, join_local_ranks, rank_placement, start_local_ranks
from deepinfer.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput, TokenLogprobs
from deepinfer.sampling_params import SamplingParams
from deepinfer.structured_outputs import grammar_library
from deepinfer.tokenizer import IncrementalDetokenizer, StopStringMatcher, Tokenizer

logger = logging.getLogger("deepinfer")

PromptType = Union[str, Sequence[int], Mapping[str, Any]]
Messages = Sequence[Mapping[str, Any]]

_live_engines: "weakref.WeakSet[DeepInferenceEngine]" = weakref.WeakSet()


@atexit.register
def _shutdown_live_engines() -> None:
    for engine in list(_live_engines):
        engine.shutdown()


def _looks_like_hub_id(name: str) -> bool:
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and not os.path.exists(name)


def resolve_model_path(name: str | None, revision: str | None = None,
                       download_dir: str | os.PathLike | None = None) -> tuple[Path, str | None]:
    """A local directory for `name` (None: the embedded model) and the load format it implies, if any. A hub id is
    downloaded at ``revision`` into ``download_dir`` (Hugging Face's cache_dir); both only mean something for one."""
    if name is None or Path(name).expanduser().is_dir():
        for option, value in (("revision", revision), ("download_dir", download_dir)):
            if value is not None:
                logger.warning("%s=%r is ignored: the model is %s, not a hub id", option, value,
                               "the embedded demo model" if name is None else f"the local directory {name!r}")
    if name is None:
        path, load_format = default_model()
        return path, load_format
    path = Path(name).expanduser()
    if path.is_dir():
        return path, None
    if _looks_like_hub_id(name):
        try:
            from huggingface_hub import snapshot_download
        except ImportError:  # pragma: no cover - depends on the environment
            raise ValueError(f"model {name!r} is not a local directory, and huggingface_hub is not installed "
                             "to download it") from None
        try:
            local = snapshot_download(name, revision=revision,
                                      cache_dir=None if download_dir is None else str(download_dir),
                                      allow_patterns=["*.json", "*.safetensors", "*.jinja", "tokenizer*"])
        except Exception as e:  # network, authentication, unknown repository or revision
            at = f" at revision {revision!r}" if revision is not None else ""
            raise ValueError(f"model {name!r} is not a local directory and could not be downloaded{at}: {e}") from e
        return Path(local), None
    raise ValueError(f"model path {name!r} does not exist or is not a directory")


class _Completion:
    """One of a request's n completions: one request of the C++ engine."""

    def __init__(self, index: int, core_id: int, tokenizer: Tokenizer, prompt_ids: list[int],
                 params: SamplingParams) -> None:
        self.index = index
        self.core_id = core_id
        self.params = params
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=params.skip_special_tokens)
        self.token_ids: list[int] = []
        # Everything the detokenizer produced, kept only when stop strings look at it (a string grown by += is copied
        # each token: quadratic in the output's length).
        # Stop strings, over the tail of the text they can still end in (none: the text is not kept at all).
        self.stops = (StopStringMatcher(params.stop, params.include_stop_str_in_output)
                      if any(params.stop or ()) else None)
        self._text_parts: list[str] = []  # what was emitted to the user, as emitted
        self.logprobs: list[TokenLogprobs] | None = [] if params.logprobs is not None else None
        self.finished = False
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.error: str | None = None

    @property
    def text(self) -> str:
        """Everything emitted to the user so far."""
        if len(self._text_parts) > 1:
            self._text_parts = ["".join(self._text_parts)]
        return self._text_parts[0] if self._text_parts else ""

    def output(self, text: str, token_ids: list[int], logprobs: list[TokenLogprobs] | None) -> CompletionOutput:
        return CompletionOutput(index=self.index, text=text, token_ids=token_ids, finish_reason=self.finish_reason,
                                stop_reason=self.stop_reason, logprobs=logprobs, error=self.error)


def _put_all(items: list[tuple["RequestStream", RequestOutput | None]]) -> None:
    for stream, delta in items:
        stream._push(delta)


def _hand_to_loop(loop: asyncio.AbstractEventLoop, items: list[tuple["RequestStream", RequestOutput | None]]) -> None:
    try:
        loop.call_soon_threadsafe(_put_all, items)
    except RuntimeError:  # the event loop is closed: nobody is listening any more
        pass


class DeltaSink(Protocol):
    """Where a stream submitted with ``sink=`` sends its deltas instead of to an iteration: the dispatcher thread
    calls ``deliver`` once a dispatch with all of that sink's (stream, delta) pairs, in order, None ending a
    stream. It must return quickly and never raise (it runs on the thread that feeds every request)."""

    def deliver(self, items: list[tuple["RequestStream", RequestOutput | None]]) -> None: ...


def _hand_to(receiver: "asyncio.AbstractEventLoop | DeltaSink",
             items: list[tuple["RequestStream", RequestOutput | None]]) -> None:
    if isinstance(receiver, asyncio.AbstractEventLoop):
        _hand_to_loop(receiver, items)
    else:
        receiver.deliver(items)


class _LoopBatches:
    """The deltas of one dispatch, by receiver (an asyncio stream's event loop, or a stream's DeltaSink): each
    receiver gets its streams' deltas in one call, in order."""

    def __init__(self) -> None:
        self._items: dict[Any, list[tuple[RequestStream, RequestOutput | None]]] = {}

    def add(self, receiver: Any, stream: "RequestStream", delta: RequestOutput | None) -> None:
        self._items.setdefault(receiver, []).append((stream, delta))

    def flush(self) -> None:
        for receiver, items in self._items.items():
            _hand_to(receiver, items)
        self._items.clear()


class RequestStream:
    """A submitted request. Iterate it (sync or async) for deltas; `result()` waits for the whole output.

    Each delta is a RequestOutput whose completions carry only what is new: text, token ids and logprobs since
    the previous delta, and finish_reason once that completion has finished.
    """

    def __init__(self, engine: "DeepInferenceEngine", request_id: str, prompt: str | None, prompt_ids: list[int],
                 params: SamplingParams, loop: asyncio.AbstractEventLoop | None, iterated: bool = True,
                 sink: DeltaSink | None = None) -> None:
        self.engine = engine
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_ids
        self.params = params
        self.metrics = RequestMetrics(arrival_time=time.monotonic())
        self.completions: list[_Completion] = []
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache (completion 0's admission)
        # The prompt tokens' logprobs as they arrive (completion 0 scores the prompt); None when not asked for.
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = (
            [None] if params.prompt_logprobs is not None else None)
        if loop is not None and sink is not None:
            raise TypeError("a stream goes to an event loop or to a sink, not both")
        self._loop = loop
        self._sink = sink
        # A synchronous stream's deltas for its iteration (SimpleQueue: C, no task accounting). None for a stream
        # only waited on (generate's: result() reads the completions, never the deltas).
        self._sync_queue: queue.SimpleQueue[RequestOutput | None] | None = (
            queue.SimpleQueue() if iterated and loop is None and sink is None else None)
        self._wants_deltas = (loop is not None or sink is not None
                              or self._sync_queue is not None)  # else no delta is even made
        self._async_queue: asyncio.Queue[RequestOutput | None] | None = asyncio.Queue() if loop else None
        self._forward: tuple[asyncio.Queue, Any] | None = None  # forward_to's queue and tag
        self._done = threading.Event()

    # Called by the dispatcher thread: a synchronous stream's delta now; an asyncio or sink stream's into `batch`,
    # which the dispatcher hands to each event loop (or sink) once per engine step (one wake-up for all its streams).
    def _deliver(self, delta: RequestOutput | None, batch: "_LoopBatches | None" = None) -> None:
        receiver = self._loop if self._loop is not None else self._sink
        if receiver is not None:
            if batch is not None:
                batch.add(receiver, self, delta)
            else:
                _hand_to(receiver, [(self, delta)])
        elif self._sync_queue is not None:
            self._sync_queue.put(delta)  # (set once, in the constructor)
        if delta is None:
            self._done.set()

    # On the stream's event loop: a delta (None: the end) into its queue, or forward_to's.
    def _push(self, delta: RequestOutput | None) -> None:
        if self._forward is not None:
            self._forward[0].put_nowait((self._forward[1], delta))
        else:
            self._async_queue.put_nowait(delta)

    def forward_to(self, q: asyncio.Queue, tag: Any) -> None:
        """From now on (and with whatever is queued already) the stream's deltas go to ``q`` as ``(tag, delta)``,
        ``(tag, None)`` last, instead of to its own iteration: a consumer of many streams reads one queue, with no
        task a stream to move them. Call it on the stream's event loop; the stream is not iterated afterwards."""
        if self._async_queue is None:
            raise TypeError("forward_to needs a stream submitted with an event loop")
        while not self._async_queue.empty():
            q.put_nowait((tag, self._async_queue.get_nowait()))
        self._forward = (q, tag)

    @property
    def finished(self) -> bool:
        return all(c.finished for c in self.completions)

    def abort(self) -> None:
        self.engine._abort_stream(self)

    def __iter__(self) -> Iterator[RequestOutput]:
        if self._loop is not None:
            raise TypeError("this stream was submitted for asyncio; use `async for`")
        if self._sync_queue is None:
            raise TypeError("this stream is only waited on (result()); it keeps no deltas to iterate")
        while True:
            item = self._sync_queue.get()
            if item is None:
                return
            yield item

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        if self._async_queue is None:
            raise TypeError("this stream was submitted without an event loop; iterate it synchronously")
        while True:
            item = await self._async_queue.get()
            if item is None:
                return
            yield item

    def result(self, timeout: float | None = None) -> RequestOutput:
        """The whole output, once every completion has finished."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} did not finish within {timeout} s")
        return self.snapshot()

    def snapshot(self) -> RequestOutput:
        outputs = [c.output(c.text, list(c.token_ids), list(c.logprobs) if c.logprobs is not None else None)
                   for c in self.completions]
        return RequestOutput(request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
                             outputs=outputs, finished=self.finished, metrics=self.metrics,
                             prompt_logprobs=list(self.prompt_logprobs) if self.prompt_logprobs is not None else None,
                             num_cached_tokens=self.num_cached_tokens)


class DeepInferenceEngine:
    """Loads a DeepSeek V2/V3 checkpoint and serves generate / chat / streaming requests from it."""

    def __init__(self, config: EngineConfig | None = None, **kwargs: Any) -> None:
        if config is None:
            config = EngineConfig(**kwargs)
        elif kwargs:
            raise TypeError("pass either an EngineConfig or keyword arguments, not both")
        self.config = config
        self.device = device = self._choose_device(config)
        model_dir, implied_format = resolve_model_path(config.model_name_or_path, config.revision,
                                                       config.download_dir)
        load_format = config.load_format if config.load_format != "auto" else (implied_format or "safetensors")
        self.model_dir = model_dir
        self.is_random_model = load_format == "dummy"
        self.model_config = _deepinfer.load_model_config(str(model_dir))
        self._check_max_model_len(config, model_dir)
        weight_format = self._weight_format(config, device)
        placement = rank_placement(config)  # None: the ranks (if several) are threads of this process
        if device == "cuda":
            self._check_fits_before_load(config, model_dir, placement)
        self.tokenizer = self._load_tokenizer(config, model_dir)
        # What the checkpoint recommends for values a request leaves unset (generation_config.json).
        self.generation_defaults = load_generation_defaults(model_dir, config.generation_config)
        self._default_params = SamplingParams(**self.generation_defaults)  # a bad value fails here, naming the field
        self.served_model_name = config.served_model_name or (
            config.model_name_or_path or ("deepinfer-demo-v3" if not self.is_random_model else "deepinfer-random-tiny-v3"))

        options = _deepinfer.EngineOptions()
        options.model_path = str(model_dir)
        options.load_format = _deepinfer.LoadFormat.dummy if load_format == "dummy" else _deepinfer.LoadFormat.safetensors
        options.device = device
        options.seed = config.seed
        options.page_size = config.page_size
        options.cache_memory_bytes = int(config.cache_memory_gb * (1 << 30))
        options.gpu_memory_utilization = float(config.gpu_memory_utilization)
        options.num_cache_pages = config.num_cache_pages
        options.max_model_len = config.max_model_len or 0
        options.max_num_seqs = config.max_num_seqs
        options.max_num_batched_tokens = config.max_num_batched_tokens
        options.enforce_eager = config.enforce_eager
        options.enable_prefix_caching = config.enable_prefix_caching
        options.tensor_parallel_size = config.tensor_parallel_size
        options.enable_expert_parallel = config.enable_expert_parallel
        options.enable_dp_attention = config.enable_dp_attention
        options.collective_timeout_s = float(config.collective_timeout_s)
        options.fp8_weights = weight_format.fp8_weights
        options.fp8_activations = weight_format.fp8_activations
        options.int4_weights = weight_format.int4 == "rtn"
        options.int4_group_size = weight_format.int4_group_size
        options.int4_symmetric = weight_format.int4_symmetric
        options.kv_cache_dtype = (_deepinfer.KvCacheDtype.auto if config.kv_cache_dtype == "auto"
                                  else _deepinfer.KvCacheDtype.fp8)
        options.grammar_library = grammar_library()
        self.has_structured_outputs = bool(options.grammar_library)
        if options.grammar_library:
            options.tokenizer_json = self.tokenizer.to_json()
        if config.speculative_config is not None:
            if self.model_config.num_nextn_predict_layers < 1:
                raise ValueError(f"speculative_config: {config.model_name_or_path or 'the model'} has no MTP layer "
                                 "(num_nextn_predict_layers is 0 in its config.json); MTP speculative decoding needs one")
            options.num_speculative_tokens = config.speculative_config.num_speculative_tokens
            options.speculative_disable_by_batch_size = config.speculative_config.disable_by_batch_size or 0
            forced = config.speculative_config.forced_acceptance
            options.speculative_forced_acceptance = -1.0 if forced is None else float(forced)
        self._local_ranks: list[Any] = []  # this machine's other ranks' processes, when this one started them
        if placement is not None:
            configure_options(options, placement)
            if placement.starts_local_ranks:
                self._local_ranks = start_local_ranks(config, placement)
            if not placement.is_leader:
                # Only rank 0 serves: the other processes run its steps, then the program ends with rank 0's stop.
                logger.info("rank %s of %d (%s): running rank 0's steps", placement.rank, placement.world_size,
                            placement.launcher)
                if threading.current_thread() is threading.main_thread():
                    # The steps run in C++ without the GIL, where Python's KeyboardInterrupt would never arrive: Ctrl-C
                    # ends the process at once instead, and rank 0 reports the rank as gone.
                    signal.signal(signal.SIGINT, signal.SIG_DFL)
                try:
                    _deepinfer.run_worker_rank(options)
                finally:
                    join_local_ranks(self._local_ranks)
                raise SystemExit(0)
        self.num_speculative_tokens = config.num_speculative_tokens
        try:
            self._core = _deepinfer.Engine.create(options, self._load_progress(self.model_config.num_hidden_layers))
        except BaseException:
            for child in self._local_ranks:  # they would wait for rank 0 until their timeout
                child.kill()
            join_local_ranks(self._local_ranks)
            raise
        self.weight_bytes: dict[str, int] = dict(self._core.weight_bytes)
        logger.info("resident weights: %s", ", ".join(f"{dtype} {n / (1 << 30):.2f} GiB"
                                                      for dtype, n in self.weight_bytes.items()))
        self._max_model_len = self._core.max_model_len
        self.cache_info = {"dtype": self._core.cache_dtype, "bytes_per_token": self._core.cache_bytes_per_token}
        logger.info("latent cache: %s, %d bytes a token (all layers), %s tokens", self.cache_info["dtype"],
                    self.cache_info["bytes_per_token"], f"{self._core.stats().num_cache_pages * config.page_size:,}")
        self._warn_fp8_cache_heads(config, device)
        self._final_stats = None

        self._ids = itertools.count()
        self._seed_rng = random.Random(config.seed)
        self._lock = threading.Lock()
        self._by_core_id: dict[int, tuple[RequestStream, _Completion]] = {}
        self._closed = False
        self._closing = False
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="deepinfer-dispatch", daemon=True)
        self._dispatcher.start()
        _live_engines.add(self)

    @classmethod
    def from_config(cls, config: EngineConfig) -> "DeepInferenceEngine":
        return cls(config)

    @property
    def max_model_len(self) -> int:
        """The longest prompt + output this engine serves, in tokens."""
        return self._max_model_len

    # ------------------------------------------------------------------ setup

    @staticmethod
    def _choose_device(config: EngineConfig) -> str:
        gpus = _deepinfer.cuda_device_count()
        if config.device == "cuda" and gpus == 0:
            raise ValueError("device='cuda': no CUDA device is visible, or this build has no CUDA backend (`pip "
                             "install .` builds it where nvcc and a Hopper GPU are; `-C cmake.define.DEEPINFER_CUDA=ON` "
                             "forces it); use device='cpu'")
        device = "cuda" if config.device == "cuda" or (config.device == "auto" and gpus > 0) else "cpu"
        allowed = ("auto", "bfloat16") if device == "cuda" else ("auto", "float32")
        if config.dtype not in allowed:
            raise ValueError(f"dtype={config.dtype!r}: the {device.upper()} backend computes in "
                             f"{allowed[1]}; use dtype='auto' or {allowed[1]!r}")
        return device

    def _check_max_model_len(self, config: EngineConfig, model_dir: Path) -> None:
        """A max_model_len past the checkpoint's max_position_embeddings is refused here, from config.json alone,
        before any weight is read (as vLLM refuses it): positions the model was not trained or scaled for give
        garbage, not an error, so running anyway would only hide the mistake."""
        limit = int(self.model_config.max_position_embeddings)
        if config.max_model_len is not None and config.max_model_len > limit:
            raise ValueError(f"max_model_len={config.max_model_len} is larger than the model's "
                             f"max_position_embeddings={limit} (config.json in {model_dir}); use max_model_len "
                             f"(--max-model-len) {limit} or less, or leave it unset")

    @staticmethod
    def _check_fits_before_load(config: EngineConfig, model_dir: Path, placement: RankPlacement | None) -> None:
        """Refuses, before a weight is read, a deployment whose weights cannot fit the GPUs (deepinfer.plan, the
        arithmetic of `deepinfer plan`, in its words): without this the failure comes after minutes of loading. An
        extension without cuda_device_memory (built before it) skips the check; the engine's own after loading
        remains."""
        ask = getattr(_deepinfer, "cuda_device_memory", None)
        if ask is None:
            return
        if placement is not None:
            devices = [placement.local_rank]  # this process's rank's GPU
        else:  # the ranks take GPUs 0 .. n - 1 (too few visible: the engine says so when it starts them)
            devices = list(range(min(config.tensor_parallel_size, _deepinfer.cuda_device_count())))
        if not devices:
            return
        from deepinfer.model_dims import load_model_dims
        from deepinfer.plan import check_fits_before_load

        try:
            memory = [tuple(int(v) for v in ask(i)) for i in devices]
        except RuntimeError as e:  # the driver did not answer: creating the backend will say why, in its words
            logger.debug("no GPU memory figures before loading (%s): the plan's check is skipped", e)
            return
        plan = check_fits_before_load(load_model_dims(model_dir), config, memory, model=str(model_dir))
        log = logger.info if plan.fits else logger.warning
        log("plan: %s (before loading; the working memory is estimated, and measured after)", plan.verdict())

    def _weight_format(self, config: EngineConfig, device: str) -> WeightFormat:
        """How the linear layers are held (config.resolve_weight_format): an FP8 or 4-bit checkpoint stays as stored
        unless asked otherwise (as vLLM runs it); quantization='fp8' / 'int4' on a bf16/fp16 checkpoint quantizes its
        linear layers at load. Refuses, from config.json alone, what cannot run (a 4-bit checkpoint quantized
        again)."""
        c = self.model_config
        return resolve_weight_format(config.quantization, c.fp8, c.int4_format, device, c.fp4_format,
                                     c.fp8_activations)

    def _load_tokenizer(self, config: EngineConfig, model_dir: Path) -> Tokenizer:
        tok_dir = Path(config.tokenizer).expanduser() if config.tokenizer else model_dir
        if (tok_dir / "tokenizer.json").is_file():
            tokenizer = Tokenizer.from_dir(tok_dir)
        elif config.tokenizer:
            raise ValueError(f"tokenizer {config.tokenizer!r}: no tokenizer.json there")
        else:
            tokenizer = Tokenizer.default_deepseek_v3()
            if tokenizer.vocab_size > self.model_config.vocab_size:
                raise ValueError(f"{model_dir} has no tokenizer.json, and DeepSeek-V3's tokenizer "
                                 f"({tokenizer.vocab_size} tokens) does not fit its vocabulary "
                                 f"({self.model_config.vocab_size}); pass tokenizer=PATH")
        return tokenizer

    @staticmethod
    def _load_progress(num_layers: int) -> Callable[[int, int], None] | None:
        if os.environ.get("DEEPINFER_NO_PROGRESS"):
            return None
        from tqdm import tqdm

        bar: dict[str, Any] = {}

        def update(done: int, total: int) -> None:
            if "bar" not in bar:
                bar["bar"] = tqdm(total=total, desc="Loading weights", unit="part", leave=False)
            bar["bar"].n = done
            bar["bar"].refresh()
            if done >= total:
                bar["bar"].close()

        return update

    # ------------------------------------------------------------------ requests

    def _prompt_parts(self, prompt: PromptType) -> tuple[str | None, list[int] | None]:
        """The prompt's text and its checked token ids, or (text, None) for a text still to be tokenized."""
        if isinstance(prompt, str):
            if prompt == "":
                raise ValueError("prompt is empty")
            return prompt, None
        if isinstance(prompt, Mapping):
            if "prompt_token_ids" in prompt:
                return self._prompt_parts(list(prompt["prompt_token_ids"]))
            if "prompt" in prompt:
                return self._prompt_parts(prompt["prompt"])
            raise ValueError("a prompt mapping needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            if not ids:
                raise ValueError("prompt is empty (no token ids)")
            vocab = self.model_config.vocab_size
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
            return None, ids
        raise TypeError(f"a prompt is a string, a list of token ids or a mapping; got {type(prompt).__name__}")

    def _check_length(self, prompt_ids: list[int]) -> None:
        max_len = self.max_model_len
        if len(prompt_ids) >= max_len:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens, but max_model_len is {max_len} "
                             "(the prompt plus at least one generated token must fit)")

    def _checked_prompts(self, prompts: Sequence[PromptType]) -> list[tuple[str | None, list[int]]]:
        """Each prompt's text (None for token ids) and token ids: the one place prompts are tokenized and checked
        (ValueError / TypeError) before they are queued, the texts in one batch (the tokenizer's threads, off the
        GIL)."""
        parts = [self._prompt_parts(p) for p in prompts]
        texts = [text for text, ids in parts if ids is None]
        encoded = iter(self.tokenizer.encode_batch(texts) if texts else [])
        checked = [(text, next(encoded) if ids is None else ids) for text, ids in parts]
        for _, ids in checked:
            self._check_length(ids)
        return checked

    def submit(self, prompt: PromptType, params: SamplingParams | None = None, *,
               loop: asyncio.AbstractEventLoop | None = None, request_id: str | None = None,
               sink: DeltaSink | None = None) -> RequestStream:
        """Queues one request (n completions) and returns its stream. Raises ValueError, queuing nothing, when the
        request cannot be served. With `loop`, the stream is iterated with `async for` on that event loop; with
        `sink`, its deltas go to the sink (see DeltaSink) and the stream is not iterated."""
        if self._closed:  # before the prompt is even looked at
            raise RuntimeError("the engine is shut down")
        ((text, prompt_ids),) = self._checked_prompts([prompt])
        return self._enqueue_all([(text, prompt_ids, params or self._default_params, loop, request_id)],
                                 sink=sink)[0]

    def _enqueue_all(self, prompts: Sequence[tuple[str | None, list[int], SamplingParams,
                                                   asyncio.AbstractEventLoop | None, str | None]],
                     iterated: bool = True, sink: DeltaSink | None = None) -> list[RequestStream]:
        """Queues checked prompts (text, ids, params, loop, request id) with all their completions in one call of
        the core: every one or none, and admitted by the same step (an offline batch is scheduled the same way
        however this thread and the step thread interleave)."""
        if self._closed:
            raise RuntimeError("the engine is shut down")
        streams: list[RequestStream] = []
        core_requests: list[tuple[int, list[int], Any]] = []
        with self._lock:
            for text, prompt_ids, params, loop, request_id in prompts:
                stream = RequestStream(self, request_id or f"req-{next(self._ids)}", text, prompt_ids, params, loop,
                                       iterated, sink)
                for index in range(params.n):
                    seed = params.seed + index if params.seed is not None else self._seed_rng.getrandbits(63)
                    core_id = next(self._ids)
                    stream.completions.append(_Completion(index, core_id, self.tokenizer, prompt_ids, params))
                    core_requests.append((core_id, prompt_ids, params.to_core(seed, score_prompt=index == 0)))
                streams.append(stream)
                for c in stream.completions:  # before the core has them: their outputs find them
                    self._by_core_id[c.core_id] = (stream, c)
        # Without the lock: the core compiles the batch's grammars here, while the dispatcher goes on delivering.
        try:
            self._core.add_requests(core_requests)  # raises ValueError having queued nothing
        except BaseException:
            with self._lock:
                for stream in streams:
                    for c in stream.completions:
                        self._by_core_id.pop(c.core_id, None)
            raise
        return streams

    def _abort_stream(self, stream: RequestStream) -> None:
        for c in stream.completions:
            if not c.finished:
                self._abort_core(c.core_id)

    def abort(self, stream: RequestStream) -> None:
        self._abort_stream(stream)

    # ------------------------------------------------------------------ dispatcher

    def _dispatch_loop(self) -> None:
        while True:
            try:
                deltas = self._core.wait_outputs(0.1)
            except Exception:  # pragma: no cover - the core is gone
                logger.exception("the engine's output queue failed")
                return
            if self._closing and not deltas:
                return  # the core has stopped and everything it emitted was delivered
            self._dispatch(deltas)

    def _dispatch(self, deltas: Sequence[Any]) -> None:
        """One wait's outputs of the core (its step's, usually): each applied to its completion and handed on."""
        batch = _LoopBatches()
        with self._lock:
            entries = [self._by_core_id.get(d.request_id) for d in deltas]
        for d, entry in zip(deltas, entries):
            if entry is None or entry[1].finished:
                continue  # a completion finished here already (a stop string) and was aborted in the core
            try:
                self._apply(entry[0], entry[1], d, batch)
            except Exception:  # never let one request's bug stop the others' outputs
                logger.exception("failed to process output of request %s", entry[0].request_id)
        batch.flush()

    def _apply(self, stream: RequestStream, c: _Completion, d: Any, batch: _LoopBatches | None = None) -> None:
        now = time.monotonic()
        if d.new_token_ids and stream.metrics.first_token_time is None:
            stream.metrics.first_token_time = now
        stream.metrics.num_preemptions = max(stream.metrics.num_preemptions, d.num_preemptions)
        if c.index == 0:
            stream.num_cached_tokens = d.num_cached_tokens
        if d.prompt_logprobs and stream.prompt_logprobs is not None and c.index == 0:
            for r in d.prompt_logprobs:
                entry = {t.token: Logprob(t.token, t.logprob) for t in r.top_logprobs}
                entry[r.token] = Logprob(r.token, r.logprob)
                stream.prompt_logprobs.append(entry)
        new_ids = list(d.new_token_ids)
        new_logprobs: list[TokenLogprobs] | None = None
        if c.logprobs is not None:
            new_logprobs = [TokenLogprobs(token_id=r.token, logprob=r.logprob,
                                          top=[Logprob(t.token, t.logprob) for t in r.top_logprobs])
                            for r in d.logprobs]
        # A step that accepted drafts brings several tokens: they are taken one at a time, so that a stop string ends
        # the output at the token that completes it, as it would without speculative decoding.
        emit, stopped, taken = "", False, 0
        for i in range(max(len(new_ids), 1)):
            last = i + 1 >= len(new_ids)
            text_delta = c.detokenizer.step(new_ids[i:i + 1]) if new_ids else ""
            if d.finished and last:
                text_delta += c.detokenizer.flush()
            if c.stops is not None:
                part, stopped = c.stops.feed(text_delta, final=d.finished and last)
            else:
                part = text_delta
            emit += part
            taken = i + 1 if new_ids else 0
            if stopped:
                break
        new_ids = new_ids[:taken]
        if new_logprobs is not None:
            new_logprobs = new_logprobs[:taken]
        if emit:
            c._text_parts.append(emit)
        c.token_ids.extend(new_ids)
        if new_logprobs is not None and c.logprobs is not None:
            c.logprobs.extend(new_logprobs)
        if stopped:
            c.finished, c.finish_reason = True, "stop"
            c.stop_reason = c.stops.stop_reason
            if not d.finished:
                self._abort_core(c.core_id)  # the core would keep generating: free its pages now
        elif d.finished:
            c.finished, c.finish_reason = True, d.finish_reason
            c.error = d.error or None
            if d.finish_reason == "stop" and c.token_ids:
                c.stop_reason = c.token_ids[-1] if c.token_ids[-1] in c.params.stop_token_ids else None
        if c.finished:
            with self._lock:
                self._by_core_id.pop(c.core_id, None)
        all_done = stream.finished
        if all_done:
            stream.metrics.finish_time = now
        if stream._wants_deltas and (emit or new_ids or c.finished):
            delta = RequestOutput(request_id=stream.request_id, prompt=stream.prompt,
                                  prompt_token_ids=stream.prompt_token_ids,
                                  outputs=[c.output(emit, new_ids, new_logprobs)], finished=all_done,
                                  metrics=stream.metrics,
                                  prompt_logprobs=list(stream.prompt_logprobs)
                                  if all_done and stream.prompt_logprobs is not None else None,
                                  num_cached_tokens=stream.num_cached_tokens)
            stream._deliver(delta, batch)
        if all_done:
            stream._deliver(None, batch)

    # ------------------------------------------------------------------ user API

    def _params(self, sampling_params: SamplingParams | None, kwargs: dict[str, Any]) -> SamplingParams:
        if sampling_params is not None and not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"sampling_params must be SamplingParams, got {type(sampling_params).__name__}")
        if sampling_params is None:
            return SamplingParams.from_kwargs(self._default_params, **kwargs) if kwargs else self._default_params
        return SamplingParams.from_kwargs(sampling_params, **kwargs) if kwargs else sampling_params

    def prepare_structured_outputs(self) -> bool:
        """Opens the grammar engine now (about a second for DeepSeek-V3's vocabulary) instead of at the first
        constrained request; False when llguidance is not installed. Safe from any thread."""
        if not self.has_structured_outputs:
            return False
        self._core.prepare_grammar()
        return True

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the checkpoint's generation_config.json values (see EngineConfig.generation_config);
        what generate(), chat(), stream() and submit() use when given no sampling parameters."""
        return SamplingParams(**self.generation_defaults)

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 use_tqdm: bool | None = None, **kwargs: Any) -> list[RequestOutput]:
        """Generates for one prompt or a list of them; results come back in input order.

        A prompt is a string, a list of token ids, or {"prompt": ...} / {"prompt_token_ids": ...}. Sampling
        parameters come as a SamplingParams (one, or one per prompt) and/or keyword arguments (temperature=0.6,
        max_tokens=128, ...). Every prompt is validated before any is queued.
        """
        batch = self._as_prompt_list(prompts)
        if isinstance(sampling_params, Sequence) and not isinstance(sampling_params, (str, bytes)):
            if len(sampling_params) != len(batch):
                raise ValueError(f"{len(sampling_params)} sampling params for {len(batch)} prompts")
            per_prompt = [self._params(p, dict(kwargs)) for p in sampling_params]
        else:
            params = self._params(sampling_params, dict(kwargs))
            per_prompt = [params] * len(batch)
        # Every prompt tokenized and checked once, all before any is queued.
        checked = self._checked_prompts(batch)
        # Waited on with result(), never iterated: their deltas need no queue.
        streams = self._enqueue_all([(text, ids, params, None, None)
                                     for (text, ids), params in zip(checked, per_prompt)], iterated=False)
        return self._collect(streams, use_tqdm)

    def _collect(self, streams: list[RequestStream], use_tqdm: bool | None) -> list[RequestOutput]:
        show = use_tqdm if use_tqdm is not None else len(streams) >= 16
        bar = None
        if show:
            from tqdm import tqdm
            bar = tqdm(total=len(streams), desc="Generating", unit="req")
        try:
            results = []
            for s in streams:
                results.append(s.result())
                if bar is not None:
                    bar.update(1)
            return results
        except BaseException:
            for s in streams:
                s.abort()
            raise
        finally:
            if bar is not None:
                bar.close()

    @staticmethod
    def _as_prompt_list(prompts: Any) -> list[PromptType]:
        if isinstance(prompts, (str, Mapping)):
            return [prompts]
        if isinstance(prompts, Sequence) and prompts and all(isinstance(t, int) for t in prompts):
            return [prompts]  # one prompt of token ids
        if isinstance(prompts, Sequence):
            if not prompts:
                raise ValueError("no prompts given")
            return list(prompts)
        raise TypeError(f"prompts must be a string, token ids, or a list of those; got {type(prompts).__name__}")

    def render_chat(self, messages: Messages, *, add_generation_prompt: bool = True,
                    chat_template_kwargs: Mapping[str, Any] | None = None,
                    chat_template: str | None = None, continue_final_message: bool = False) -> list[int]:
        """Token ids of a conversation rendered with the checkpoint's chat template, or with ``chat_template`` (a
        Jinja source, or the name of one of the checkpoint's named templates) when given. ``continue_final_message``:
        the rendering ends inside the final message (no end of turn), for a reply that continues it."""
        return self.tokenizer.chat_prompt_ids(messages, add_generation_prompt=add_generation_prompt,
                                              chat_template_kwargs=chat_template_kwargs, chat_template=chat_template,
                                              continue_final_message=continue_final_message)

    def chat(self, messages: Messages | Sequence[Messages], sampling_params: SamplingParams | None = None, *,
             use_tqdm: bool | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
             **kwargs: Any) -> RequestOutput | list[RequestOutput]:
        """Answers one conversation (a list of messages) or several (a list of such lists)."""
        many = bool(messages) and isinstance(messages[0], Sequence) and not isinstance(messages[0], (str, Mapping))
        conversations = list(messages) if many else [messages]
        prompts = [{"prompt_token_ids": self.render_chat(c, chat_template_kwargs=chat_template_kwargs)}
                   for c in conversations]
        results = self.generate(prompts, sampling_params, use_tqdm=use_tqdm, **kwargs)
        return results if many else results[0]

    def stream(self, prompt: PromptType, sampling_params: SamplingParams | None = None,
               **kwargs: Any) -> Iterator[RequestOutput]:
        """Yields deltas of one request as they are generated. Breaking out of the loop aborts the request."""
        s = self.submit(prompt, self._params(sampling_params, dict(kwargs)))
        try:
            yield from s
        finally:
            if not s.finished:
                s.abort()

    def _abort_core(self, core_id: int) -> None:
        core = self._core
        if core is not None:  # after shutdown nothing runs any more
            core.abort(core_id)

    def _warn_fp8_cache_heads(self, config: EngineConfig, device: str) -> None:
        """The FP8 cache's decode kernel takes 16 heads a CTA: past 16 heads a GPU each tile is widened several times
        over, and decode attention is slower than over the bf16 cache (benchmarks/results/fp8_h200.md)."""
        if device != "cuda" or config.kv_cache_dtype == "auto":
            return
        heads = self.model_config.num_attention_heads
        if not config.enable_dp_attention:
            heads //= config.tensor_parallel_size
        if heads > 16:
            logger.warning("kv_cache_dtype=%r with %d attention heads a GPU: the FP8 cache holds 1.76x the tokens, but "
                           "its decode kernel is tuned for 16 heads a GPU and attends up to 3x slower than the bf16 "
                           "cache at this head count (tensor parallelism brings DeepSeek-V3 to 16 a GPU at 8 GPUs)",
                           config.kv_cache_dtype, heads)

    def stats(self) -> Any:
        core = self._core
        return core.stats() if core is not None else self._final_stats

    def speculative_stats(self) -> dict[str, Any] | None:
        """MTP speculative decoding so far: verifications, draft tokens checked and accepted, the acceptance rate, the
        mean tokens a verification yields (accepted drafts + 1), the acceptance rate by draft position and the
        requests admitted without drafts (past speculative_config.disable_by_batch_size); None without speculative
        decoding."""
        if self.num_speculative_tokens == 0:
            return None
        s = self.stats()
        drafts, checked, accepted = s.spec_num_drafts, s.spec_num_draft_tokens, s.spec_num_accepted_tokens
        return {"num_drafts": drafts, "num_draft_tokens": checked, "num_accepted_tokens": accepted,
                "acceptance_rate": accepted / checked if checked else 0.0,
                "mean_accepted_length": 1.0 + accepted / drafts if drafts else 0.0,
                "acceptance_rate_per_position": [n / drafts if drafts else 0.0 for n in s.spec_accepted_per_position],
                "num_requests_not_speculating": s.spec_num_requests_not_speculating,
                "drafter_failure": s.spec_drafter_failure or None}

    def shutdown(self) -> None:
        """Aborts what is still running, stops the engine's threads and frees its memory (the model, the cache: on a
        GPU at once, not whenever the garbage collector gets to this object). Idempotent; stats() stays readable."""
        if self._closed:
            return
        self._closed = True
        self._core.shutdown()  # the step thread ends every request it still holds as aborted
        self._closing = True
        self._dispatcher.join(timeout=10)
        if not self._dispatcher.is_alive():
            self._final_stats = self._core.stats()
            self._core = None  # the last reference: the C++ engine, its backend and device memory go now
        join_local_ranks(self._local_ranks)  # the core's shutdown stopped them

    def __enter__(self) -> "DeepInferenceEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self.shutdown()
        except Exception:
            pass
