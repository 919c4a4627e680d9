"""Checks of exercise ex07: multi-head attention carried over, the transformer block, text generation.

The block is judged against ``nn.TransformerEncoderLayer(batch_first=True)`` given the same weights, for both
``norm_first``, in float64, with a causal and a padding mask; its known mistakes are rows (:class:`Block`) of
one parametrised computation, :func:`block`. ``generate`` runs a small causal language model of the checks
(:class:`ToyLM`, built from weights in the learner's process): greedy decoding is compared token for token,
sampling by its properties (the same generator seed gives the same tokens, top-k never leaves the k most
likely tokens, the frequencies follow the softmax of the logits divided by the temperature).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attention_course.checks import attention_family as family
from attention_course.checks import engine, ex04
from attention_course.checks.engine import (
    Check,
    Driver,
    Mistake,
    Part,
    Seeded,
    assert_shape,
    assert_values,
    behaviour,
    fail,
    randn,
)

HINTS = family.exception_hints("""
attribute 'self_attn' | attribute 'linear1' | attribute 'linear2' | attribute 'norm1' | attribute 'norm2':
    name the sub-modules as the task says (self_attn, linear1, linear2, norm1, norm2): the checks copy
    nn.TransformerEncoderLayer's weights into them
""") + tuple(ex04.HINTS)
GENERATE_HINTS = engine.hint_table("""
probability tensor contains either | invalid multinomial distribution: temperature=0 is greedy decoding: take
    the argmax of the logits instead of dividing them by 0 (and never sample from NaN)
Tensors must have same number of dimensions | Sizes of tensors must match: the new token must be [batch, 1]
    before it is concatenated to the sequence [batch, len]: argmax(dim=-1, keepdim=True), or
    multinomial(probs, 1)
Expected a 'cuda' device type for generator | Expected a 'cpu' device type for generator: the generator and
    the probabilities must be on the same device
""")
TEXT = engine.table("""
norm first ignored: the block normalises after the residual sum although norm_first=True: pre-LN is x = x +
    sublayer(norm(x))
norm first inverted: norm_first is read the wrong way round: norm_first=True is pre-LN, x = x +
    sublayer(norm(x)); False is post-LN, x = norm(x + sublayer(x))
no attention residual: the residual connection around self-attention is missing
no ffn residual: the residual connection around the feed-forward network is missing
norms swapped: the layer norms are swapped: norm1 goes with self-attention, norm2 with the feed-forward
    network
gelu: the feed-forward network uses GELU: nn.TransformerEncoderLayer's default activation is ReLU
no final norm: post-LN normalises after both residual sums: norm2 after the feed-forward network's too
mask ignored: the mask is not passed to the self-attention
mask inverted: the mask is inverted: the course's masks say True = may attend, so pass it as it is (only
    nn.MultiheadAttention wants True = blocked)
dropout never: dropout is never applied in training mode: use nn.Dropout(dropout) modules on the sub-layers'
    outputs (they act in train() mode only)
dropout always: dropout is applied in eval() mode too: use nn.Dropout modules (they follow train()/eval()), or
    F.dropout(x, p, training=self.training)
last token only: only the last token goes through the model: feed the whole sequence so far (the model is
    causal and needs the context), and take the logits of its last position
first position: the logits of the first position are used: the next token comes from the last position's
    logits, logits[:, -1, :]
new tokens only: only the new tokens are returned: return the prompt followed by them, [batch, prompt_len +
    max_new_tokens]
not top k: a token outside the k most likely was drawn: set every logit below the k-th largest to -inf before
    the softmax (torch.topk(logits, k).values[:, -1:])
same for two seeds: two different generators gave the same tokens: pass generator to torch.multinomial (the
    sampling must use it, not the global random state)
not reproducible: the same generator seed gave different tokens: draw every random number from generator
    (torch.multinomial(probabilities, 1, generator=generator)), not from the global random state
temperature ignored: the temperature is ignored: divide the logits by it before the softmax
temperature multiplied: the logits are multiplied by the temperature: divide them by it (T < 1 sharpens)
temperature after softmax: the temperature is applied after the softmax: divide the logits, then take the
    softmax
""")
SHAPES = engine.table("""
generate batch max_new_tokens: only the new tokens are returned: return the prompt followed by them
generate batch plus_one: one token too many or the prompt counted twice: add exactly max_new_tokens tokens
""")


@dataclass(frozen=True)
class Sizes:
    """The sizes of one block call; ``q_len == k_len`` (self-attention)."""

    batch: int
    length: int
    d_model: int
    n_heads: int
    d_ff: int


VISIBLE = Sizes(2, 6, 12, 3, 20)
HIDDEN = (Sizes(3, 5, 20, 5, 28), Sizes(1, 7, 8, 2, 12), Sizes(2, 4, 16, 4, 36))


# ==================================================================================================
# 1. multi-head attention, carried over from exercise 4


@behaviour(function="MultiHeadAttention", points=1, hints=ex04.HINTS, driver=ex04.FORWARD)
def mha_carried_over(part: Part) -> Iterator[Check]:
    """Your MultiHeadAttention from exercise 4 (with load_torch_weights) computes what nn.MultiheadAttention
    computes given the same weights, with and without masks."""
    return ex04.carried_over(part, seed=300)


# ==================================================================================================
# 2. the block: weights as data, the driver, PyTorch's answer, the mistakes

ATTENTIONS = {"self": "self_attn"}  # prefix -> nn.TransformerEncoderLayer's attention
BLOCK_WEIGHTS = family.layer_weight_names(ATTENTIONS, 2)


def block_weights(sizes: Sizes, *, seed: int, device, dtype=torch.float64) -> dict[str, torch.Tensor]:
    """Weights of ``nn.TransformerEncoderLayer(d_model, n_heads, d_ff)`` (layer norms near 1 and 0)."""
    return family.layer_weights(
        sizes.d_model, sizes.d_ff, ATTENTIONS, 2, seed=seed, device=device, dtype=dtype
    )


def build_torch_block(arguments: dict[str, Any], dropout: float = 0.0) -> nn.TransformerEncoderLayer:
    """``nn.TransformerEncoderLayer(batch_first=True)`` with the weights of ``arguments``, in eval mode."""
    w = arguments
    layer = nn.TransformerEncoderLayer(
        w["d_model"],
        w["n_heads"],
        w["d_ff"],
        dropout=dropout,
        batch_first=True,
        norm_first=w["norm_first"],
        device=w["x"].device,
        dtype=w["self_in_w"].dtype,
    )
    return family.load_layer_weights(layer, w, ATTENTIONS).eval()


def _prepare_block(**arguments: Any) -> dict[str, Any]:
    rest = {name: value for name, value in arguments.items() if name not in BLOCK_WEIGHTS}
    return {**rest, "torch_layer": build_torch_block(arguments)}


def _block(cls: Any, d_model, n_heads, d_ff, norm_first, dropout, torch_layer, like: torch.Tensor) -> Any:
    block = cls(d_model, n_heads, d_ff, norm_first=norm_first, dropout=dropout)
    block = block.to(dtype=like.dtype, device=like.device)
    block.self_attn.load_torch_weights(torch_layer.self_attn)
    for name in ("linear1", "linear2", "norm1", "norm2"):
        getattr(block, name).load_state_dict(getattr(torch_layer, name).state_dict())
    return block.eval()


def _forward(cls: Any, *, d_model, n_heads, d_ff, norm_first, torch_layer, x, mask=None) -> Any:
    """Construct the learner's block (dropout 0), load the weights, and call it in eval mode (the kernel)."""
    return _block(cls, d_model, n_heads, d_ff, norm_first, 0.0, torch_layer, x)(x, mask)


def _parameters(cls: Any, *, d_model, n_heads, d_ff, norm_first, torch_layer, x, mask, probe) -> Any:
    """The block's parameter count, and the gradient of every parameter of ``(block(x) * probe).sum()``."""
    block = _block(cls, d_model, n_heads, d_ff, norm_first, 0.0, torch_layer, x)
    (block(x, mask) * probe).sum().backward()
    return [(name, p.numel(), p.grad) for name, p in block.named_parameters()]


def _dropout(cls: Any, *, d_model, n_heads, d_ff, norm_first, torch_layer, x, mask) -> Any:
    """A block with ``dropout=0.5``: two calls in train mode, two in eval mode (the kernel)."""
    block = _block(cls, d_model, n_heads, d_ff, norm_first, 0.5, torch_layer, x)
    with torch.no_grad():
        block.train()
        trained = [block(x, mask) for _ in range(2)]
        block.eval()
        evaluated = [block(x, mask) for _ in range(2)]
    return (*trained, *evaluated)


FORWARD = Driver(_forward, _prepare_block)
PARAMETERS = Driver(_parameters, _prepare_block)
DROPOUT = Driver(_dropout, _prepare_block)


@dataclass(frozen=True)
class Block:
    """A way of computing the block: the right one, or a known mistake (its ``hint``)."""

    hint: str = ""
    norm_first: str = "as given"  # "ignored" (always post-LN), "inverted"
    residual: tuple[bool, bool] = (True, True)
    norms: tuple[int, int] = (1, 2)
    activation: str = "relu"
    final_norm: bool = True
    mask: str = "as given"  # "ignored", "inverted"


def block(arguments: dict[str, Any], row: Block = Block()) -> torch.Tensor:
    """The block's output as ``row`` computes it, in float64 (check code)."""
    a = family.cast(arguments, torch.float64)
    mask = a.get("mask")
    if mask is not None and row.mask != "as given":
        mask = None if row.mask == "ignored" else ~mask

    def attention(x: torch.Tensor) -> torch.Tensor:
        weights = {
            "in_proj_weight": a["self_in_w"],
            "in_proj_bias": a["self_in_b"],
            "out_proj_weight": a["self_out_w"],
            "out_proj_bias": a["self_out_b"],
        }
        call = {"d_model": a["d_model"], "n_heads": a["n_heads"], **weights, "query": x, "key": x, "value": x}
        return ex04.forward({**call, "mask": mask})[0]

    def norm(n: int, x: torch.Tensor) -> torch.Tensor:
        n = row.norms[n - 1]
        return F.layer_norm(x, x.shape[-1:], a[f"norm{n}_w"], a[f"norm{n}_b"])

    act = F.relu if row.activation == "relu" else F.gelu

    def feed_forward(x: torch.Tensor) -> torch.Tensor:
        return F.linear(act(F.linear(x, a["linear1_w"], a["linear1_b"])), a["linear2_w"], a["linear2_b"])

    if row.norm_first == "as given":
        pre = a["norm_first"]
    else:
        pre = row.norm_first == "inverted" and not a["norm_first"]
    x = a["x"]
    for n, sublayer in ((1, attention), (2, feed_forward)):
        keep = x if row.residual[n - 1] else 0
        if pre:
            x = keep + sublayer(norm(n, x))
        else:
            x = keep + sublayer(x)
            x = norm(n, x) if (n == 1 or row.final_norm) else x
    return x


BLOCK_ROWS = (
    Block(TEXT["norm first ignored"], norm_first="ignored"),
    Block(TEXT["norm first inverted"], norm_first="inverted"),
    Block(TEXT["no attention residual"], residual=(False, True)),
    Block(TEXT["no ffn residual"], residual=(True, False)),
    Block(TEXT["norms swapped"], norms=(2, 1)),
    Block(TEXT["gelu"], activation="gelu"),
    Block(TEXT["no final norm"], final_norm=False),
    Block(TEXT["mask ignored"], mask="ignored"),
    Block(TEXT["mask inverted"], mask="inverted"),
)


def block_mistakes(arguments: dict[str, Any]) -> Iterator[Mistake]:
    for row in BLOCK_ROWS:
        yield Mistake(row.hint, block(arguments, row))


def torch_block(arguments: dict[str, Any]) -> torch.Tensor:
    """``nn.TransformerEncoderLayer``'s output in float64, the mask negated (``True`` = blocked there)."""
    wide = family.cast(arguments, torch.float64)
    layer, mask, x = build_torch_block(wide), wide.get("mask"), wide["x"]
    blocked = None
    if mask is not None:
        batch, length, heads = x.size(0), x.size(1), wide["n_heads"]
        blocked = ~mask.expand(batch, heads, length, length).reshape(batch * heads, length, length)
    with torch.no_grad():
        return layer(x, src_mask=blocked)


def block_inputs(sizes: Sizes, *, seed: int, device, norm_first: bool, dtype=torch.float64) -> dict[str, Any]:
    """The arguments of one block call: sizes, weights, ``x`` and the causal mask combined with a padding mask
    (``[batch, 1, len, len]``; every query keeps key 0)."""
    x = randn((sizes.batch, sizes.length, sizes.d_model), seed=seed, device=device, dtype=dtype)
    causal = torch.ones(sizes.length, sizes.length, dtype=torch.bool, device=device).tril()
    padding = torch.ones(sizes.batch, sizes.length, dtype=torch.bool, device=device)
    padding[0, -2:] = False  # the first sequence is two tokens shorter
    return {
        "d_model": sizes.d_model,
        "n_heads": sizes.n_heads,
        "d_ff": sizes.d_ff,
        "norm_first": norm_first,
        **block_weights(sizes, seed=seed + 10, device=device, dtype=dtype),
        "x": x,
        "mask": causal & padding[:, None, None, :],
    }


# ==================================================================================================
# the behaviours of the block


@behaviour(function="TransformerBlock", points=3, hints=HINTS, driver=FORWARD)
def block_matches_torch(part: Part) -> Iterator[Check]:
    """TransformerBlock computes what nn.TransformerEncoderLayer(batch_first=True) computes given the same
    weights, post-LN (norm_first=False) and pre-LN (norm_first=True), with a causal and padding mask."""
    cases = (VISIBLE,) if not part.hidden else HIDDEN
    for index, sizes in enumerate(cases):
        for norm_first in (False, True):
            arguments = block_inputs(sizes, seed=320 + 10 * index, device=part.device, norm_first=norm_first)
            call = part.call(**arguments)

            def judge(result: Any, arguments=arguments, call=call) -> None:
                if isinstance(result, tuple | list):
                    fail(
                        f"{call} returned a {type(result).__name__}: the block returns one tensor, "
                        "[batch, len, d_model] (drop the attention weights)"
                    )
                assert_values(
                    result,
                    torch_block(arguments),
                    f"the output of {call}",
                    dtype=torch.float64,
                    mistakes=lambda: block_mistakes(arguments),
                )

            yield Check(call, judge)


@behaviour(function="TransformerBlock", points=1, hints=HINTS, driver=PARAMETERS)
def block_parameters(part: Part) -> Iterator[Check]:
    """The block has 4 d^2 + 4 d (attention) + 2 d d_ff + d_ff + d (feed-forward) + 4 d (two layer norms)
    parameters, and every one of them gets a gradient."""
    cases = (VISIBLE,) if not part.hidden else HIDDEN
    for index, sizes in enumerate(cases):
        arguments = block_inputs(sizes, seed=340 + 10 * index, device=part.device, norm_first=index % 2 == 1)
        probe = randn((sizes.batch, sizes.length, sizes.d_model), seed=349 + index, device=part.device)
        call = part.call(**arguments, probe=probe)

        def judge(result: Any, call=call, sizes=sizes) -> None:
            d, f = sizes.d_model, sizes.d_ff
            expected = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d
            total = sum(int(n) for _, n, _ in result)
            if total != expected:
                causes = {
                    expected - 2 * d: "only one layer norm: the block has two, norm1 and norm2",
                    expected
                    + 2 * d: "three layer norms: the block has two (a decoder-only block has no third)",
                    expected - f - d: "the feed-forward network's linear layers have no biases",
                }
                fail(
                    f"the block of {call} has {total} parameters, expected {expected}.",
                    causes.get(total, "the sub-modules are not those of the task"),
                )
            for name, _, grad in result:
                if not isinstance(grad, torch.Tensor) or not torch.isfinite(grad).all():
                    fail(
                        f"the parameter {name} gets no gradient through {call}.",
                        "it is not used in forward, or is frozen, or used through .data",
                    )

        yield Check(call, judge)


@behaviour(function="TransformerBlock", points=1, hints=HINTS, driver=DROPOUT)
def block_dropout(part: Part) -> Iterator[Check]:
    """With dropout=0.5 the block is random in train() mode (two calls differ) and deterministic in eval()
    mode, where it equals nn.TransformerEncoderLayer."""
    cases = (VISIBLE,) if not part.hidden else HIDDEN[:1]
    for index, sizes in enumerate(cases):
        arguments = block_inputs(sizes, seed=360 + 10 * index, device=part.device, norm_first=True)
        call = part.call(**arguments)

        def judge(result: Any, arguments=arguments, call=call) -> None:
            train1, train2, eval1, eval2 = result
            if not torch.equal(eval1, eval2):
                fail(f"two calls in eval() mode of {call} with dropout=0.5 differ.", TEXT["dropout always"])
            expected = torch_block(arguments)
            where = f"the output in eval() mode of {call} with dropout=0.5"
            assert_values(
                eval1, expected, where, dtype=torch.float64, mistakes=lambda: block_mistakes(arguments)
            )
            if torch.allclose(train1.double(), expected, atol=1e-9) or torch.equal(train1, train2):
                fail(f"in train() mode, {call} with dropout=0.5 is not random.", TEXT["dropout never"])

        yield Check(call, judge)


# ==================================================================================================
# 3. generation: a small causal language model of the checks, built from weights in the learner's process


class ToyLM(nn.Module):
    """A causal language model of the checks: ``logits_t = 3 tanh(E[x_t] + mean(E[x_0..t])) W``.

    Position ``t``'s logits depend on every token up to ``t`` (so feeding the last token alone is wrong) and
    on none after it.
    """

    def __init__(self, embedding: torch.Tensor, output: torch.Tensor) -> None:
        super().__init__()
        self.embedding = nn.Parameter(embedding, requires_grad=False)  # [vocab, d]
        self.output = nn.Parameter(output, requires_grad=False)  # [d, vocab]
        self.max_len = 1024

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding[tokens]  # [batch, len, d]
        counts = torch.arange(1, tokens.size(1) + 1, device=tokens.device, dtype=x.dtype)[:, None]
        context = x.cumsum(dim=1) / counts  # the mean of the tokens so far
        return 3 * torch.tanh(x + context) @ self.output  # [batch, len, vocab]


VOCAB, WIDTH = 11, 8
#: where generate's checks put the model and the prompt, whatever the other checks use: on CUDA,
#: torch.multinomial given NaN or infinite probabilities (a temperature of 0 without its greedy branch,
#: say) stops with a device-side assert, after which every CUDA call of the learner's kernel fails, and with
#: it every later cell. On the CPU it raises an error that this cell reports; the model is too small to need
#: a GPU.
GENERATE_DEVICE = torch.device("cpu")


def model_weights(*, seed: int, device) -> dict[str, torch.Tensor]:
    return {
        "embedding": randn((VOCAB, WIDTH), seed=seed, device=device),
        "output": randn((WIDTH, VOCAB), seed=seed + 1, device=device) / math.sqrt(WIDTH),
    }


def _prepare_generate(**arguments: Any) -> dict[str, Any]:
    model = ToyLM(arguments.pop("embedding"), arguments.pop("output"))
    generator = arguments.get("generator")
    if generator is not None and model.embedding.device.type != "cpu":  # a generator on the model's device
        device = model.embedding.device
        arguments["generator"] = torch.Generator(device=device).manual_seed(generator.initial_seed())
    return {"model": model, **arguments}


def _generate(fn: Any, *, model, prompt, max_new_tokens, temperature, top_k=None, generator=None) -> Any:
    """The learner's ``generate`` on the checks' model (the kernel)."""
    return fn(model, prompt, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)


GENERATE = Driver(_generate, _prepare_generate)


def _model(arguments: dict[str, Any]) -> ToyLM:
    return ToyLM(arguments["embedding"], arguments["output"])


def greedy(arguments: dict[str, Any], mistake: str = "") -> torch.Tensor:
    """Greedy decoding as the reference does it, or as ``mistake`` does (check code)."""
    model, tokens = _model(arguments), arguments["prompt"]
    with torch.no_grad():
        for _ in range(arguments["max_new_tokens"]):
            context = tokens[:, -1:] if mistake == "last token only" else tokens
            position = 0 if mistake == "first position" else -1
            next_token = model(context)[:, position].argmax(dim=-1, keepdim=True)
            tokens = torch.cat([tokens, next_token], dim=1)
    return tokens[:, arguments["prompt"].size(1) :] if mistake == "new tokens only" else tokens


def _prompt(batch: int, length: int, *, seed: int, device) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=engine.seeded_generator(seed)).to(device)


def _tokens(result: Any, call: Any, batch: int, prompt_len: int, new: int) -> torch.Tensor:
    length = prompt_len + new
    hints = engine.shapes(SHAPES, "generate", batch=batch, max_new_tokens=new, plus_one=length + 1)
    assert_shape(result, f"the result of {call}", (batch, length), hints)
    if result.is_floating_point() or result.is_complex():
        fail(f"the result of {call} holds {result.dtype} numbers: token ids are integers (torch.long).")
    return result


@behaviour(function="generate", points=2, hints=GENERATE_HINTS, driver=GENERATE)
def generate_greedy(part: Part) -> Iterator[Check]:
    """With temperature=0, generate is greedy: at each step the argmax of the last position's logits given the
    whole sequence so far; it returns the prompt followed by max_new_tokens tokens."""
    cases = ((3, 3, 6),) if not part.hidden else ((3, 1, 6), (1, 4, 3), (4, 2, 0))
    for index, (batch, prompt_len, new) in enumerate(cases):
        seed = (440 if not part.hidden else 470) + 10 * index  # the visible case tells the mistakes apart
        arguments = {
            **model_weights(seed=seed, device=GENERATE_DEVICE),
            "prompt": _prompt(batch, prompt_len, seed=seed + 5, device=GENERATE_DEVICE),
            "max_new_tokens": new,
            "temperature": 0.0,
        }
        call = part.call(**arguments)

        def judge(result: Any, arguments=arguments, call=call, size=(batch, prompt_len, new)) -> None:
            tokens = _tokens(result, call, *size)
            right = greedy(arguments)

            def wrong() -> Iterator[Mistake]:
                for mistake in ("last token only", "first position"):
                    yield Mistake(TEXT[mistake], greedy(arguments, mistake))

            assert_values(tokens.cpu(), right.cpu(), f"the tokens of {call}", mistakes=wrong)

        yield Check(call, judge)


def _sampling(arguments: dict[str, Any], temperature: float) -> torch.Tensor:
    """The distribution of the first new token, ``[batch, vocab]``, at ``temperature`` (float64)."""
    with torch.no_grad():
        logits = _model(arguments)(arguments["prompt"])[:, -1].double().cpu()
    return (
        torch.softmax(logits / temperature, dim=-1)
        if temperature > 0
        else F.one_hot(logits.argmax(-1), VOCAB)
    )


@behaviour(function="generate", points=2, hints=GENERATE_HINTS, driver=GENERATE)
def generate_sampling(part: Part) -> Iterator[Check]:
    """Sampling draws from softmax(logits / temperature) with the generator given (the same seed gives the
    same tokens, another seed other tokens), and with top_k never picks a token outside the k most likely."""
    offset = 0 if not part.hidden else 50
    weights = model_weights(seed=420 + offset, device=GENERATE_DEVICE)
    prompt = _prompt(6, 3, seed=425 + offset, device=GENERATE_DEVICE)
    base = {**weights, "prompt": prompt, "max_new_tokens": 6, "temperature": 1.0, "top_k": 3}
    calls = tuple(
        part.call(label, **base, generator=Seeded(seed))
        for label, seed in (
            ("", 1 + offset),
            ("again with the same seed", 1 + offset),
            ("with another seed", 2),
        )
    )
    yield Check(calls, lambda *results: _judge_top_k(results, calls, base))
    # the first new token of 2000 copies of two prompts, at two temperatures: its frequencies
    for temperature in (0.5, 2.0):
        rows = _prompt(2, 2, seed=430 + offset, device=GENERATE_DEVICE).repeat_interleave(1000, dim=0)
        arguments = {
            **weights,
            "prompt": rows,
            "max_new_tokens": 1,
            "temperature": temperature,
            "top_k": None,
        }
        call = part.call(**arguments, generator=Seeded(7 + offset))
        yield Check(call, lambda result, call=call, a=arguments: _judge_frequencies(result, call, a))


def _judge_top_k(results: tuple, calls: tuple, base: dict[str, Any]) -> None:
    tokens = [_tokens(r, c, 6, 3, 6).cpu() for r, c in zip(results, calls, strict=True)]
    if not torch.equal(tokens[0][:, :3], base["prompt"].cpu()):
        fail(
            f"the tokens of {calls[0]} do not start with the prompt.",
            "return the prompt followed by the new tokens",
        )
    if not torch.equal(tokens[0], tokens[1]):
        fail(f"{calls[1]} gave other tokens than {calls[0]}.", TEXT["not reproducible"])
    if torch.equal(tokens[0], tokens[2]):
        fail(f"{calls[2]} gave the same tokens as {calls[0]}.", TEXT["same for two seeds"])
    model = _model(base)
    with torch.no_grad():
        logits = model(tokens[0].to(base["prompt"].device)).cpu()  # position t predicts token t + 1
    top = logits[:, 2:-1].topk(3, dim=-1).indices  # [batch, 6, 3]
    drawn = tokens[0][:, 3:, None]
    outside = ~(top == drawn).any(-1)
    if outside.any():
        b, t = outside.nonzero()[0].tolist()
        fail(
            f"in {calls[0]}, new token {t} of sequence {b} is {drawn[b, t, 0].item()}, not one of the 3 most "
            f"likely ({top[b, t].tolist()}).",
            TEXT["not top k"],
        )


def _judge_frequencies(result: Any, call: Any, arguments: dict[str, Any]) -> None:
    tokens = _tokens(result, call, 2000, 2, 1).cpu()
    temperature = arguments["temperature"]
    drawn = F.one_hot(tokens[:, -1], VOCAB).double()  # [2000, vocab]
    seen = torch.stack([drawn[:1000].mean(0), drawn[1000:].mean(0)])  # [2, vocab]
    logits_probs = _sampling({**arguments, "prompt": arguments["prompt"][::1000]}, 1.0)
    right = _sampling({**arguments, "prompt": arguments["prompt"][::1000]}, temperature)

    def distance(p: torch.Tensor) -> float:  # the largest total-variation distance of the two prompts
        return (seen - p).abs().sum(-1).max().item() / 2

    if distance(right) <= 0.07:
        return
    candidates = {
        TEXT["temperature ignored"]: logits_probs,
        TEXT["temperature multiplied"]: _sampling(
            {**arguments, "prompt": arguments["prompt"][::1000]}, 1 / temperature
        ),
        TEXT["temperature after softmax"]: torch.softmax(logits_probs / temperature, dim=-1),
    }
    cause = next((hint for hint, p in candidates.items() if distance(p) <= 0.07), "")
    fail(
        f"the first new tokens of {call} do not follow softmax(logits / {temperature:g}): their frequencies "
        f"are {distance(right):.2f} away from it in total variation (at most 0.07 expected from 1000 draws).",
        cause,
    )
