"""Checks of exercise ex07: multi-head attention carried over, the transformer block, text generation.

The block is judged against ``nn.TransformerEncoderLayer(batch_first=True)`` given the same weights, for both
``norm_first``, both activations, in float64 and float32, without a mask and with a causal, a padding and a
combined mask; its known mistakes are rows (:class:`Block`) of one parametrised computation, :func:`block`.
Its dropout is judged in train() mode through forward hooks on its sub-modules (:func:`_judge_placement`):
each residual branch must be ``x + dropout(sublayer)`` and the feed-forward network ``linear2(dropout(
act(linear1(x))))``, whatever order the random numbers are drawn in. ``generate`` runs a small causal language
model of the checks (:class:`ToyLM`, built from weights in the learner's process): greedy decoding is compared
token for token (with and without the model's ``max_len`` window), sampling by its properties (the same
generator seed gives the same tokens, top-k never leaves the k most likely tokens) and by the frequencies of
many draws against the exact distribution, top-k, ties and temperature included (:func:`_judge_frequencies`,
whose false-failure rate is below 1e-6 per cell).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attention_course.checks import attention_family as family
from attention_course.checks import engine, ex04
from attention_course.checks import module_family as mf
from attention_course.checks.engine import (
    Check,
    Driver,
    Mistake,
    Part,
    Seeded,
    assert_shape,
    assert_values,
    behaviour,
    dtype_name,
    fail,
    randn,
)
from attention_course.checks.module_family import Sizes

HINTS = family.exception_hints("""
attribute 'self_attn' | attribute 'linear1' | attribute 'linear2' | attribute 'norm1' | attribute 'norm2':
    name the sub-modules as the task says (self_attn, linear1, linear2, norm1, norm2): the checks copy
    nn.TransformerEncoderLayer's weights into them
Unexpected key(s) in state_dict & "bias" | both have biases: a sub-layer of the block has no bias: keep the
    default bias=True of MultiHeadAttention, nn.Linear and nn.LayerNorm (the block's 4 d^2 + 4 d + 2 d d_ff +
    d_ff + d + 4 d parameters include their biases)
mat1 and mat2 must have the same dtype | mixed dtype: the block computes in another dtype than x's: no
    .float()/.double() casts inside it (its parameters have x's dtype)
""") + tuple(ex04.HINTS)
GENERATE_HINTS = engine.hint_table("""
probability tensor contains either | invalid multinomial distribution: the probabilities hold NaN or inf:
    temperature=0 is greedy decoding: take the argmax of the logits instead of dividing them by 0; with a
    small positive temperature, exp() of the divided logits overflows: take torch.softmax (it subtracts the
    maximum first)
Tensors must have same number of dimensions | Sizes of tensors must match: the new token must be [batch, 1]
    before it is concatenated to the sequence [batch, len]: argmax(dim=-1, keepdim=True), or
    multinomial(probs, 1)
Expected a 'cuda' device type for generator | Expected a 'cpu' device type for generator: the generator and
    the probabilities must be on the same device
more than max_len: the model was given more than model.max_len tokens: feed it the last model.max_len tokens
    of the sequence so far (tokens[:, -model.max_len:]), as the docstring says
has no attribute 'max_len': this model has no max_len attribute: crop the sequence only when the model has
    one (getattr(model, "max_len", None))
selected index k out of range: top_k is larger than the vocabulary: then every token is kept (torch.topk
    cannot take more than the vocabulary's size: min(top_k, vocab))
'NoneType' object has no attribute 'device': generator may be None: then sample with torch's global
    random state (torch.multinomial(probabilities, 1, generator=None))
expected a non-empty list of Tensors: with max_new_tokens=0 there is no new token: return the prompt itself
    (start from the prompt and concatenate each new token to it)
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
gelu: the feed-forward network uses GELU although activation='relu' (the default, as in
    nn.TransformerEncoderLayer)
activation ignored: the activation argument is ignored: activation='gelu' asks for GELU (F.gelu) in the
    feed-forward network, not ReLU
gelu tanh: the tanh approximation of GELU is used: activation='gelu' is the exact GELU, F.gelu(x)
    (approximate='none'), as in nn.TransformerEncoderLayer
no final norm: post-LN normalises after both residual sums: norm2 after the feed-forward network's too
mask ignored: the mask is not passed to the self-attention
mask inverted: the mask is inverted: the course's masks say True = may attend, so pass it as it is (only
    nn.MultiheadAttention wants True = blocked)
always causal: the block applies a causal mask of its own: with mask=None every query attends every key (an
    encoder block), and a given mask is used as it is; the caller passes the causal mask when it wants one
dtype: the block's output must have x's dtype (that of its parameters): no .float()/.double() casts
dropout never: dropout is never applied in training mode: use nn.Dropout(dropout) modules on the sub-layers'
    outputs (they act in train() mode only)
dropout always: dropout is applied in eval() mode too: use nn.Dropout modules (they follow train()/eval()), or
    F.dropout(x, p, training=self.training)
dropout default: with dropout left to its default, 0.0, the block is not the same in train() mode: the
    dropout probability is the argument dropout (0.0 by default), not a number of your own
dropout input: dropout is applied to the block's input x: it goes on each sub-layer's output, before the
    residual sum, x + dropout(sublayer(...))
dropout sublayer input: dropout is applied to a sub-layer's input (after a layer norm): it goes on the
    sub-layer's output, before the residual sum, x + dropout(sublayer(...))
dropout after norm: dropout is applied after the last layer norm: post-LN's output is norm2(...) itself
dropout after sum: dropout is applied after the residual sum: it goes on the sub-layer's output before it,
    x + dropout(sublayer(...)), not dropout(x + sublayer(...))
dropout scale: the kept values are not scaled by 1 / (1 - dropout): dropout is applied with another
    probability than the argument dropout, twice in a row, or without rescaling; use one
    nn.Dropout(dropout) per place
dropout attention: no dropout on the self-attention's output: x + dropout(self_attn(...)) (Vaswani et al.,
    section 5.4, residual dropout)
dropout activation: no dropout after the activation inside the feed-forward network:
    linear2(dropout(act(linear1(x)))), as in nn.TransformerEncoderLayer
dropout ffn: no dropout on the feed-forward network's output before the residual sum: x +
    dropout(linear2(...))
dropout placement: the residual branch is not x + dropout(sublayer(...)): dropout goes on each sub-layer's
    output, before the residual sum, and after the activation inside the feed-forward network
last token only: only the last token goes through the model: feed the whole sequence so far (the model is
    causal and needs the context), and take the logits of its last position
first position: the logits of the first position are used: the next token comes from the last position's
    logits, logits[:, -1, :]
window at the start: the model gets the first model.max_len tokens: it gets the last ones,
    tokens[:, -model.max_len:], the end of the sequence so far
new tokens only: only the new tokens are returned: return the prompt followed by them, [batch, prompt_len +
    max_new_tokens]
token dtype: token ids stay in the prompt's dtype, torch.long: concatenate the new tokens (as argmax and
    multinomial return them, int64) to the prompt, without converting them
not top k: a token outside the k most likely was drawn: set every logit below the k-th largest to -inf before
    the softmax (torch.topk(logits, k).values[:, -1:])
top k minus one: only k - 1 tokens are kept: the k-th largest logit is kept too (drop the logits below it,
    logits < kth, not those at it, logits <= kth)
top k plus one: k + 1 tokens are kept: the k-th largest logit is values[:, k - 1], the last of
    torch.topk(logits, k).values
top k ignored: top_k is ignored: set every logit below the k-th largest to -inf before the softmax
ties dropped: a token whose logit equals the k-th largest is never drawn: the docstring keeps the tokens tied
    with the k-th largest too; mask the logits below the k-th largest value (logits < kth) rather than keep
    the k indices of torch.topk
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

# The learner's docstrings clause by clause, and the behaviours that check each (tests/test_contracts.py).
CONTRACT = engine.table("""
MultiHeadAttention d_model: mha_carried_over; 8 to 20 (exercise 4's checks, carried over)
MultiHeadAttention n_heads: mha_carried_over; 2 to 5 heads
MultiHeadAttention bias: mha_carried_over; True, its default (bias=False is exercise 4's mha_matches_torch)
MultiHeadAttention raises ValueError: mha_carried_over; not checked here: exercise 4's mha_shapes checks it,
    and TransformerBlock's cell checks that the block raises it
MultiHeadAttention.forward query: mha_carried_over; [batch, q_len, d_model] against nn.MultiheadAttention
MultiHeadAttention.forward key: mha_carried_over; [batch, k_len, d_model]
MultiHeadAttention.forward value: mha_carried_over; [batch, k_len, d_model]
MultiHeadAttention.forward mask: mha_carried_over; None and [batch, q_len, k_len]; [q_len, k_len] and
    [batch, 1, 1, k_len] too in the hidden part
MultiHeadAttention.forward returns: mha_carried_over; (output, weights) as nn.MultiheadAttention's
MultiHeadAttention.forward raises TypeError: mha_carried_over; not checked here: exercise 4's mha_shapes
MultiHeadAttention.load_torch_weights torch_mha: mha_carried_over; nn.MultiheadAttention with biases
MultiHeadAttention.load_torch_weights returns: mha_carried_over; not checked here: exercise 4's mha_gradients
MultiHeadAttention.load_torch_weights raises ValueError: mha_carried_over; not checked here: exercise 4's
    mha_shapes
TransformerBlock d_model: block_matches_torch, block_parameters; 8 to 20
TransformerBlock n_heads: block_matches_torch; 2 to 5 heads
TransformerBlock d_ff: block_matches_torch, block_parameters; 12 to 36, other than 4 d_model
TransformerBlock norm_first: block_matches_torch, block_dropout; False and True, each with every mask, and
    the dropout's places in each
TransformerBlock dropout: block_dropout; 0.5 in train() mode (random, x + dropout(sublayer) on each residual
    branch and dropout after the activation, scaled by 1 / (1 - p), for both norm_first) and eval() mode (as
    PyTorch's); its default 0.0 in train() mode (deterministic, as PyTorch's)
TransformerBlock activation: block_matches_torch; left out (ReLU), 'relu' and 'gelu' (the exact GELU) given
TransformerBlock raises ValueError: block_matches_torch; an unknown activation ('swish'; 'tanh' hidden) and
    n_heads that does not divide d_model (5 of 12; 3 of 8 hidden), which the carried-over MultiHeadAttention
    raises
TransformerBlock sub-modules: block_matches_torch, block_parameters; self_attn, linear1, linear2, norm1,
    norm2 load nn.TransformerEncoderLayer's weights, biases included; every parameter gets a gradient
TransformerBlock.forward x: block_matches_torch; [batch, len, d_model] float64 and float32, len 4 to 7
TransformerBlock.forward mask: block_matches_torch; None (no mask: not causal), causal [len, len], causal and
    padding combined [batch, 1, len, len], padding [batch, 1, 1, len] (hidden)
TransformerBlock.forward returns: block_matches_torch; one tensor [batch, len, d_model] in x's dtype
generate model: generate_greedy, generate_sampling; a causal model of the checks, with a max_len attribute
    (binding and not) and without one
generate max_len window: generate_greedy; the model gets the last model.max_len tokens when the sequence is
    longer (a longer one raises ValueError in the checks' model), the whole sequence without the attribute
generate prompt: generate_greedy, generate_sampling; [batch, prompt_len] torch.long, prompt_len 1 to 3,
    batched copies of a prompt for the frequencies
generate max_new_tokens: generate_greedy, generate_sampling; 0 to 7
generate temperature: generate_greedy, generate_sampling; 0 (greedy, token for token), 0.002 to 2.0 (the
    frequencies of many draws against softmax(logits / temperature))
generate top_k: generate_sampling; None, 3 and 4 (the exact renormalised distribution, tokens tied with the
    k-th largest kept), larger than the vocabulary (every token)
generate generator: generate_sampling; the same seed gives the same tokens, another seed other tokens, None
    samples with the global random state (on the CPU: a CUDA model with a CPU generator is not checked)
generate returns: generate_greedy, generate_sampling; [batch, prompt_len + max_new_tokens], the prompt first,
    the prompt's dtype (torch.long) in the greedy cell
generate raises ValueError: generate_greedy, generate_sampling; max_new_tokens < 0 (greedy cell), temperature
    < 0 and top_k < 1 (sampling cell)
""")


# the sizes of one block call; q_len == k_len, the length (self-attention)
VISIBLE = Sizes(2, 6, 6, 12, 3, d_ff=20)
HIDDEN = (Sizes(3, 5, 5, 20, 5, d_ff=28), Sizes(1, 7, 7, 8, 2, d_ff=12), Sizes(2, 4, 4, 16, 4, d_ff=36))


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
BLOCK_WEIGHTS = mf.layer_weight_names(ATTENTIONS, 2)
SUBLAYERS = ("self_attn", "norm1", "linear1", "linear2", "norm2")  # the sub-modules the dropout cell watches
DROPOUT = 0.5  # the dropout cell's probability: kept values are scaled by 1 / (1 - DROPOUT) = 2


def build_torch_block(arguments: dict[str, Any]) -> nn.TransformerEncoderLayer:
    """``nn.TransformerEncoderLayer(batch_first=True, dropout=0)`` with the weights of ``arguments``, in eval
    mode."""
    activation = arguments.get("activation") or "relu"
    return mf.torch_layer(
        nn.TransformerEncoderLayer, arguments, ATTENTIONS, dropout=0.0, activation=activation
    )


def _block(
    cls: Any, d_model, n_heads, d_ff, norm_first, dropout, torch_layer, like: torch.Tensor, activation=None
) -> Any:
    """The learner's block, built with the arguments given (``dropout`` or ``activation`` ``None``: left to
    their defaults), with PyTorch's weights, in eval mode."""
    options = {"norm_first": norm_first}
    options |= {"dropout": dropout} if dropout is not None else {}
    options |= {"activation": activation} if activation is not None else {}
    block = mf.learner_module(cls, d_model, n_heads, d_ff, like=like, **options)
    return (mf.load_torch_layer(block, torch_layer) if torch_layer is not None else block).eval()


def _forward(
    cls: Any, *, d_model, n_heads, d_ff, norm_first, torch_layer, x, mask=None, activation=None
) -> Any:
    """Construct the learner's block (dropout 0), load the weights, and call it in eval mode (the kernel)."""
    return _block(cls, d_model, n_heads, d_ff, norm_first, 0.0, torch_layer, x, activation)(x, mask)


def _parameters(cls: Any, *, d_model, n_heads, d_ff, norm_first, torch_layer, x, mask, probe) -> Any:
    """The block's parameter count, and the gradient of every parameter of ``(block(x) * probe).sum()``."""
    block = _block(cls, d_model, n_heads, d_ff, norm_first, 0.0, torch_layer, x)
    (block(x, mask) * probe).sum().backward()
    return [(name, p.numel(), p.grad) for name, p in block.named_parameters()]


def _dropout(cls: Any, *, d_model, n_heads, d_ff, norm_first, torch_layer, x, mask) -> Any:
    """A block with ``dropout=0.5``: a call in train mode watched by forward hooks on its sub-modules (their
    first input and output, :data:`SUBLAYERS`), another in train mode, two in eval mode; then, for pre-LN, the
    block with dropout left to its default, in train mode (the kernel)."""
    block = _block(cls, d_model, n_heads, d_ff, norm_first, DROPOUT, torch_layer, x)
    seen: dict[str, tuple] = {}

    def watch(name: str) -> Any:
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            first = args[0] if args else next(iter(kwargs.values()), None)
            output = output[0] if isinstance(output, tuple | list) and output else output
            if name not in seen and isinstance(first, torch.Tensor) and isinstance(output, torch.Tensor):
                seen[name] = (first.detach().clone(), output.detach().clone())

        return hook

    modules = {name: getattr(block, name, None) for name in SUBLAYERS}
    with torch.no_grad():
        block.train()
        handles = [
            module.register_forward_hook(watch(name), with_kwargs=True)
            for name, module in modules.items()
            if isinstance(module, nn.Module)
        ]
        try:
            watched = block(x, mask)
        finally:
            for handle in handles:
                handle.remove()
        trained = block(x, mask)
        block.eval()
        evaluated = [block(x, mask) for _ in range(2)]
        default = None
        if norm_first:  # one layer-norm placement is enough to show a dropout probability of its own
            default = _block(cls, d_model, n_heads, d_ff, norm_first, None, torch_layer, x).train()(x, mask)
    inside = tuple((name, *seen.get(name, (None, None))) for name in SUBLAYERS)
    return (watched, trained, *evaluated, default, inside)


PREPARE = mf.prepare_layer(build_torch_block, BLOCK_WEIGHTS)  # (no weights: a documented error)
FORWARD, PARAMETERS = Driver(_forward, PREPARE), Driver(_parameters, PREPARE)
DROPOUTS = Driver(_dropout, PREPARE)


@dataclass(frozen=True)
class Block:
    """A way of computing the block: the right one, or a known mistake (its ``hint``)."""

    hint: str = ""
    norm_first: str = "as given"  # "ignored" (always post-LN), "inverted"
    residual: tuple[bool, bool] = (True, True)
    norms: tuple[int, int] = (1, 2)
    activation: str = "as given"  # "relu", "gelu", "tanh" (GELU's tanh approximation), whatever is asked
    final_norm: bool = True
    mask: str = "as given"  # "ignored", "inverted", "causal" (a causal mask of its own, with the one given)


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "tanh": functools.partial(F.gelu, approximate="tanh")}


def block(arguments: dict[str, Any], row: Block = Block()) -> torch.Tensor:
    """The block's output as ``row`` computes it, in float64 (check code)."""
    a = family.cast(arguments, torch.float64)
    mask, length = a.get("mask"), a["x"].size(1)
    if row.mask == "causal":
        causal = torch.ones(length, length, dtype=torch.bool, device=a["x"].device).tril()
        mask = causal if mask is None else mask & causal
    elif mask is not None and row.mask != "as given":
        mask = None if row.mask == "ignored" else ~mask

    act = ACTIVATIONS[a.get("activation") or "relu" if row.activation == "as given" else row.activation]
    attention = lambda x: ex04.forward(mf.layer_attention(a, "self", x, x, mask))[0]  # noqa: E731
    return mf.residuals(a, (attention, lambda x: mf.feed_forward(a, x, act)), row, row.residual)


BLOCK_ROWS = (
    Block(TEXT["norm first ignored"], norm_first="ignored"),
    Block(TEXT["norm first inverted"], norm_first="inverted"),
    Block(TEXT["no attention residual"], residual=(False, True)),
    Block(TEXT["no ffn residual"], residual=(True, False)),
    Block(TEXT["norms swapped"], norms=(2, 1)),
    Block(TEXT["gelu"], activation="gelu"),
    Block(TEXT["activation ignored"], activation="relu"),
    Block(TEXT["gelu tanh"], activation="tanh"),
    Block(TEXT["no final norm"], final_norm=False),
    Block(TEXT["mask ignored"], mask="ignored"),
    Block(TEXT["mask inverted"], mask="inverted"),
    Block(TEXT["always causal"], mask="causal"),
)


def block_mistakes(arguments: dict[str, Any]) -> Iterator[Mistake]:
    for row in BLOCK_ROWS:
        yield Mistake(row.hint, block(arguments, row))


def torch_block(arguments: dict[str, Any], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``nn.TransformerEncoderLayer``'s output in ``dtype``, the mask negated (``True`` = blocked there)."""
    wide = family.cast(arguments, dtype)
    x = wide["x"]
    blocked = mf.blocked(wide.get("mask"), (x.size(0), wide["n_heads"], x.size(1), x.size(1)))
    with torch.no_grad():
        return build_torch_block(wide)(x, src_mask=blocked)


def block_inputs(
    sizes: Sizes,
    *,
    seed: int,
    device,
    norm_first: bool,
    dtype=torch.float64,
    mask: str = "both",
    activation: str | None = None,
) -> dict[str, Any]:
    """The arguments of one block call: sizes, weights, ``x`` and a mask: ``"both"``, the causal mask combined
    with a padding mask (``[batch, 1, len, len]``); ``"causal"`` (``[len, len]``); ``"padding"`` (``[batch,
    1, 1, len]``); ``"none"`` (``None``). The first sequence is two tokens shorter; every query keeps key 0.
    ``activation`` is passed when given."""
    causal = torch.ones(sizes.q_len, sizes.q_len, dtype=torch.bool, device=device).tril()
    padding = torch.ones(sizes.batch, sizes.q_len, dtype=torch.bool, device=device)
    padding[0, -2:] = False  # the first sequence is two tokens shorter
    masks = {
        "both": causal & padding[:, None, None, :],
        "causal": causal,
        "padding": padding[:, None, None, :],
        "none": None,
    }
    return {
        "d_model": sizes.d_model,
        "n_heads": sizes.n_heads,
        "d_ff": sizes.d_ff,
        "norm_first": norm_first,
        **mf.layer_weights(sizes, ATTENTIONS, 2, seed=seed + 10, device=device, dtype=dtype),
        **mf.sequences(sizes, ("x",), seed=seed, device=device, dtype=dtype),
        "mask": masks[mask],
        **({"activation": activation} if activation is not None else {}),
    }


@dataclass(frozen=True)
class Case:
    """One call of the block in its values cell: the layer-norm placement, mask, dtype and activation."""

    norm_first: bool
    mask: str = "both"  # block_inputs' kinds
    dtype: torch.dtype = torch.float64
    activation: str | None = None  # None: left to its default


# the visible part's cases on VISIBLE, then the hidden part's on each of HIDDEN
CASES = (
    (
        Case(False),
        Case(True),
        Case(False, "none", torch.float32),
        Case(True, "causal", activation="gelu"),
    ),
    (
        (Case(False), Case(True)),
        (Case(False), Case(True), Case(False, "padding", torch.float32, "gelu")),
        (Case(False), Case(True)),
    ),
)
# documented errors: (sizes, activation) of the visible part, then of the hidden part
BLOCK_ERRORS = (
    ((VISIBLE, "swish"), (Sizes(1, 6, 6, 12, 5, d_ff=20), None)),
    ((HIDDEN[1], "tanh"), (Sizes(1, 7, 7, 8, 3, d_ff=12), None)),
)


# ==================================================================================================
# the behaviours of the block


#: PyTorch's answers (float64) and their error in the case's dtype, by case: a plan is made again for each
#: run of a cell, and every submission's judge needs them
_ANSWERS: dict[tuple, tuple[torch.Tensor, float]] = {}


def _answer(key: tuple, arguments: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """PyTorch's output for ``arguments`` in float64, and the error of PyTorch's layer run in their dtype (the
    scale of the tolerance), computed once per ``key``."""
    if key not in _ANSWERS:
        expected, naive, dtype = torch_block(arguments), 0.0, arguments["x"].dtype
        if dtype != torch.float64:
            naive = (torch_block(arguments, dtype).double() - expected).abs().max().item()
        _ANSWERS[key] = (expected, naive)
    return _ANSWERS[key]


def _block_check(part: Part, sizes: Sizes, case: Case, seed: int) -> Check:
    arguments = block_inputs(
        sizes,
        seed=seed,
        device=part.device,
        norm_first=case.norm_first,
        dtype=case.dtype,
        mask=case.mask,
        activation=case.activation,
    )
    call = part.call(**arguments)

    def judge(result: Any) -> None:
        if isinstance(result, tuple | list):
            fail(
                f"{call} returned a {type(result).__name__}: the block returns one tensor, "
                "[batch, len, d_model] (drop the attention weights)"
            )
        x, where = arguments["x"], f"the output of {call}"
        assert_shape(result, where, x.shape)
        if result.dtype != x.dtype:
            fail(f"{where} is {dtype_name(result.dtype)} where x is {dtype_name(x.dtype)}.", TEXT["dtype"])
        expected, naive = _answer((sizes, case, seed, str(part.device)), arguments)
        assert_values(
            result,
            expected,
            where,
            dtype=case.dtype,
            naive_error=naive,
            mistakes=lambda: block_mistakes(arguments),
        )

    return Check(call, judge)


@behaviour(function="TransformerBlock", points=3, hints=HINTS, driver=FORWARD)
def block_matches_torch(part: Part) -> Iterator[Check]:
    """TransformerBlock computes what nn.TransformerEncoderLayer(batch_first=True) computes given the same
    weights, post-LN (norm_first=False) and pre-LN (norm_first=True), with a causal and padding mask.

    Also without a mask (no mask: not causal), with a causal mask [len, len] and a padding mask [batch, 1, 1,
    len] alone, activation='gelu' (the exact GELU), in float32 (the output in x's dtype); and the
    constructor's documented ValueError (an unknown activation, n_heads that does not divide d_model)."""
    cases = ((VISIBLE, CASES[0]),) if not part.hidden else tuple(zip(HIDDEN, CASES[1], strict=True))
    for index, (sizes, row) in enumerate(cases):
        for number, case in enumerate(row):
            # the first two cases of each size (both norm_first, the same inputs) keep their seeds of before
            yield _block_check(part, sizes, case, seed=320 + 10 * index + (100 * number if number > 1 else 0))
    for sizes, activation in BLOCK_ERRORS[part.hidden]:
        x = randn((sizes.batch, sizes.q_len, sizes.d_model), seed=390, device=part.device)
        given = {"activation": activation} if activation is not None else {}
        call = part.call(
            d_model=sizes.d_model, n_heads=sizes.n_heads, d_ff=sizes.d_ff, norm_first=False, **given, x=x
        )
        if activation is not None:
            condition = f"for the unknown activation {activation!r}"
            hint = "in __init__, raise ValueError for an activation other than 'relu' and 'gelu'"
        else:
            condition = f"when n_heads={sizes.n_heads} does not divide d_model={sizes.d_model}"
            hint = (
                "build self_attn = MultiHeadAttention(d_model, n_heads) in __init__: exercise 4's class "
                "raises ValueError there when n_heads does not divide d_model"
            )
        yield engine.raises(call, "ValueError", condition, hint)


@behaviour(function="TransformerBlock", points=1, hints=HINTS, driver=PARAMETERS)
def block_parameters(part: Part) -> Iterator[Check]:
    """The block has 4 d^2 + 4 d (attention) + 2 d d_ff + d_ff + d (feed-forward) + 4 d (two layer norms)
    parameters, and every one of them gets a gradient."""
    for index, sizes in enumerate(mf.cases(part, VISIBLE, HIDDEN)):
        arguments = block_inputs(sizes, seed=340 + 10 * index, device=part.device, norm_first=index % 2 == 1)
        probe = randn((sizes.batch, sizes.q_len, sizes.d_model), seed=349 + index, device=part.device)
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
            mf.gradients_reach(result, call, "it is not used in forward, or is frozen, or used through .data")

        yield Check(call, judge)


def _as_dropout(total: torch.Tensor, base: Any, value: torch.Tensor, rel: float) -> str:
    """How ``total - base`` relates to ``dropout(value)`` with :data:`DROPOUT`: ``""`` when each element is 0
    or ``value / (1 - p)`` (some of each); else ``"none"`` (it is ``value``), ``"scale <c>"`` (0 or ``c *
    value``), ``"other"``. ``rel``: the precision of the tensors, relative to their largest element."""
    branch = total - base
    if branch.shape != value.shape:
        return "other"
    scale, tol = 1 / (1 - DROPOUT), rel * (1 + total.abs().max().item() + value.abs().max().item())
    live = value.abs() > 1e3 * tol  # where dropping an element shows
    zero = branch.abs() <= tol * scale
    if torch.allclose(branch, value, rtol=0, atol=tol):
        return "none"
    kept = ~zero & live
    if not kept.any() or not (zero & live).any():
        return "other"
    ratios = branch[kept] / value[kept]
    if not torch.allclose(ratios, ratios[:1].expand_as(ratios), rtol=1e-2 * math.sqrt(rel), atol=0):
        return "other"
    if not (zero | ~live | ((branch - scale * value).abs() <= tol * scale)).all():
        return f"scale {ratios[0].item():.3g}"
    return ""


def _judge_placement(output: torch.Tensor, inside: tuple, arguments: dict[str, Any], where: str) -> None:
    """Fail unless the inputs and outputs of the sub-modules, recorded in train() mode, show dropout on each
    sub-layer's output before the residual sum and after the activation, and nowhere else. A sub-module that
    forward never called is left out (its relations are not judged)."""
    recorded = [(name, first, out) for name, first, out in inside if isinstance(first, torch.Tensor)]
    recorded = [(name, first, out) for name, first, out in recorded if isinstance(out, torch.Tensor)]
    dtypes = {t.dtype for _, first, out in recorded for t in (first, out)} | {output.dtype}
    rel = 1e-9 if dtypes == {torch.float64} else 1e-5  # a float32 step rounds at 6e-8
    seen = {
        name: (first.detach().cpu().double(), out.detach().cpu().double()) for name, first, out in recorded
    }
    x, output = arguments["x"].detach().cpu().double(), output.detach().cpu().double()
    nothing = (None, None)
    attn_in, attn_out = seen.get("self_attn", nothing)
    norm1_in, norm1_out = seen.get("norm1", nothing)
    ffn_in, hidden = seen.get("linear1", nothing)
    inner, ffn_out = seen.get("linear2", nothing)
    norm2_in, norm2_out = seen.get("norm2", nothing)
    act = ACTIVATIONS[arguments.get("activation") or "relu"]
    if arguments["norm_first"]:
        same = (
            ("norm1's input", norm1_in, x, TEXT["dropout input"]),
            ("self_attn's query", attn_in, norm1_out, TEXT["dropout sublayer input"]),
            ("linear1's input", ffn_in, norm2_out, TEXT["dropout sublayer input"]),
        )
        branches = (  # (what, the residual stream before, after, the sub-layer's output, hint)
            ("norm2's input minus x", x, norm2_in, attn_out, TEXT["dropout attention"]),
            ("the output minus norm2's input", norm2_in, output, ffn_out, TEXT["dropout ffn"]),
        )
    else:
        same = (
            ("self_attn's query", attn_in, x, TEXT["dropout input"]),
            ("linear1's input", ffn_in, norm1_out, TEXT["dropout sublayer input"]),
            ("the output", output, norm2_out, TEXT["dropout after norm"]),
        )
        branches = (
            ("norm1's input minus x", x, norm1_in, attn_out, TEXT["dropout attention"]),
            ("norm2's input minus norm1's output", norm1_out, norm2_in, ffn_out, TEXT["dropout ffn"]),
        )
    for name, actual, expected, cause in same:
        if actual is None or expected is None:
            continue
        if actual.shape != expected.shape or not torch.allclose(actual, expected, rtol=rel, atol=rel):
            fail(
                f"{where}, {name} is not what the block computes before it: dropout in the wrong place.",
                cause,
            )
    activated = act(hidden) if hidden is not None else None  # inside the feed-forward network: no residual
    for name, base, total, value, missing in (
        *branches,
        ("linear2's input", 0, inner, activated, TEXT["dropout activation"]),
    ):
        if base is None or total is None or value is None:
            continue
        verdict = _as_dropout(total, base, value, rel)
        if verdict == "none":
            fail(f"{where}, {name} is the sub-layer's output itself: no dropout there.", missing)
        if verdict.startswith("scale"):
            fail(
                f"{where}, {name} keeps the sub-layer's outputs multiplied by {verdict.split()[1]} (or 0), "
                f"where dropout={DROPOUT:g} keeps them multiplied by {1 / (1 - DROPOUT):g}.",
                TEXT["dropout scale"],
            )
        if verdict:
            after = _as_dropout(total, 0, base + value, rel) == ""
            fail(
                f"{where}, {name} is not dropout of the sub-layer's output (each element 0 or the output "
                f"times {1 / (1 - DROPOUT):g}).",
                TEXT["dropout after sum"] if after else TEXT["dropout placement"],
            )


@behaviour(function="TransformerBlock", points=1, hints=HINTS, driver=DROPOUTS)
def block_dropout(part: Part) -> Iterator[Check]:
    """With dropout=0.5 the block is random in train() mode (two calls differ) and deterministic in eval()
    mode, where it equals nn.TransformerEncoderLayer.

    For both norm_first, in train() mode each residual branch is x + dropout(sublayer(...)) and the
    feed-forward network linear2(dropout(act(linear1(x)))), the kept values scaled by 1 / (1 - p), judged on
    the inputs and outputs of the sub-modules; with dropout left to its default (0.0) train() mode changes
    nothing."""
    cases = ((VISIBLE, True), (VISIBLE, False)) if not part.hidden else ((HIDDEN[1], False),)
    for index, (sizes, norm_first) in enumerate(cases):
        arguments = block_inputs(sizes, seed=360 + 10 * index, device=part.device, norm_first=norm_first)
        call = part.call(**arguments)

        def judge(result: Any, arguments=arguments, call=call, sizes=sizes, norm_first=norm_first) -> None:
            *outputs, inside = result
            for output in outputs:
                if output is not None and not isinstance(output, torch.Tensor):
                    fail(f"{call} returned {engine.describe(output)}: the block returns one tensor.")
            train1, train2, eval1, eval2, default = outputs
            if not torch.equal(eval1, eval2):
                fail(f"two calls in eval() mode of {call} with dropout=0.5 differ.", TEXT["dropout always"])
            expected = _answer((sizes, norm_first, "dropout", str(part.device)), arguments)[0]
            where = f"the output in eval() mode of {call} with dropout=0.5"
            assert_values(
                eval1, expected, where, dtype=torch.float64, mistakes=lambda: block_mistakes(arguments)
            )
            if torch.allclose(train1.double(), expected, atol=1e-9) or torch.equal(train1, train2):
                fail(f"in train() mode, {call} with dropout=0.5 is not random.", TEXT["dropout never"])
            _judge_placement(train1, inside, arguments, f"in train() mode, in {call} with dropout=0.5")
            if default is not None and not engine.close(
                default, expected, engine.coarser(torch.float64, default.dtype)
            ):
                fail(
                    f"in train() mode, {call} with dropout left to its default is not what PyTorch's layer "
                    "computes without dropout.",
                    TEXT["dropout default"],
                )

        yield Check(call, judge)


# ==================================================================================================
# 3. generation: a small causal language model of the checks, built from weights in the learner's process


class ToyLM(nn.Module):
    """A causal language model of the checks: ``logits_t = 3 tanh(E[x_t] + mean(E[x_0..t])) W``.

    Position ``t``'s logits depend on every token up to ``t`` (so feeding the last token alone is wrong) and
    on none after it. With ``max_len`` the model has that attribute and refuses longer sequences, as a model
    with learned positions does; ``quantize`` rounds the logits to integers, so that some tie.
    """

    def __init__(
        self,
        embedding: torch.Tensor,
        output: torch.Tensor,
        max_len: int | None = None,
        quantize: bool = False,
    ) -> None:
        super().__init__()
        self.embedding = nn.Parameter(embedding, requires_grad=False)  # [vocab, d]
        self.output = nn.Parameter(output, requires_grad=False)  # [d, vocab]
        self.quantize = quantize
        if max_len is not None:
            self.max_len = max_len

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.size(1) > getattr(self, "max_len", tokens.size(1)):
            raise ValueError(f"the sequence has {tokens.size(1)} tokens, more than max_len={self.max_len}")
        x = self.embedding[tokens]  # [batch, len, d]
        counts = torch.arange(1, tokens.size(1) + 1, device=tokens.device, dtype=x.dtype)[:, None]
        context = x.cumsum(dim=1) / counts  # the mean of the tokens so far
        logits = 3 * torch.tanh(x + context) @ self.output  # [batch, len, vocab]
        return logits.round() if self.quantize else logits


VOCAB, WIDTH = 11, 8
LONG = 64  # a max_len that no sequence of the checks reaches
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
    model = ToyLM(
        arguments.pop("embedding"),
        arguments.pop("output"),
        arguments.pop("max_len", None),
        arguments.pop("quantize", False),
    )
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
    return ToyLM(
        arguments["embedding"],
        arguments["output"],
        arguments.get("max_len"),
        arguments.get("quantize", False),
    )


def greedy(arguments: dict[str, Any], mistake: str = "") -> torch.Tensor:
    """Greedy decoding as the reference does it, or as ``mistake`` does (check code)."""
    model, tokens, window = _model(arguments), arguments["prompt"], arguments.get("max_len")
    with torch.no_grad():
        for _ in range(arguments["max_new_tokens"]):
            context = tokens if window is None else tokens[:, -window:]
            if mistake == "last token only":
                context = tokens[:, -1:]
            elif mistake == "window at the start":
                context = tokens[:, :window]
            position = 0 if mistake == "first position" else -1
            next_token = model(context)[:, position].argmax(dim=-1, keepdim=True)
            tokens = torch.cat([tokens, next_token], dim=1)
    return tokens[:, arguments["prompt"].size(1) :] if mistake == "new tokens only" else tokens


def _prompt(batch: int, length: int, *, seed: int, device) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=engine.seeded_generator(seed)).to(device)


def _tokens(
    result: Any, call: Any, batch: int, prompt_len: int, new: int, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``result`` if it is a ``[batch, prompt_len + new]`` tensor of integers (of ``dtype`` when given)."""
    length = prompt_len + new
    hints = engine.shapes(SHAPES, "generate", batch=batch, max_new_tokens=new, plus_one=length + 1)
    assert_shape(result, f"the result of {call}", (batch, length), hints)
    if result.is_floating_point() or result.is_complex():
        fail(f"the result of {call} holds {result.dtype} numbers: token ids are integers (torch.long).")
    if dtype is not None and result.dtype != dtype:
        fail(
            f"the result of {call} has dtype {dtype_name(result.dtype)}, the prompt {dtype_name(dtype)}.",
            TEXT["token dtype"],
        )
    return result


# (batch, prompt_len, max_new_tokens, the model's max_len: None for a model without the attribute) of the
# visible part, then of the hidden part; a max_len below prompt_len + max_new_tokens crops the sequence
GREEDY = (
    ((3, 3, 6, LONG), (2, 3, 5, None), (2, 3, 5, 4), (2, 2, 0, LONG)),
    ((3, 1, 6, None), (4, 2, 0, None), (2, 2, 7, 3)),
)


@behaviour(function="generate", points=2, hints=GENERATE_HINTS, driver=GENERATE)
def generate_greedy(part: Part) -> Iterator[Check]:
    """With temperature=0, generate is greedy: at each step the argmax of the last position's logits given the
    whole sequence so far; it returns the prompt followed by max_new_tokens tokens.

    The model gets the last model.max_len tokens when the sequence is longer and the model has that
    attribute (the whole sequence when it has none); the result keeps the prompt's dtype (torch.long);
    max_new_tokens=0 returns the prompt; max_new_tokens < 0 raises ValueError."""
    for index, (batch, prompt_len, new, max_len) in enumerate(GREEDY[part.hidden]):
        seed = (440 if not part.hidden else 470) + 10 * index  # the visible case tells the mistakes apart
        prompt = _prompt(batch, prompt_len, seed=seed + 5, device=GENERATE_DEVICE)
        arguments = {
            **model_weights(seed=seed, device=GENERATE_DEVICE),
            **({"max_len": max_len} if max_len is not None else {}),
            "prompt": prompt,
            "max_new_tokens": new,
            "temperature": 0.0,
        }
        call = part.call(**arguments)

        def judge(result: Any, arguments=arguments, call=call, size=(batch, prompt_len, new)) -> None:
            tokens = _tokens(result, call, *size, dtype=arguments["prompt"].dtype)
            right = greedy(arguments)

            def wrong() -> Iterator[Mistake]:
                for mistake in ("last token only", "first position", "window at the start"):
                    yield Mistake(TEXT[mistake], greedy(arguments, mistake))

            assert_values(tokens.cpu(), right.cpu(), f"the tokens of {call}", mistakes=wrong)

        yield Check(call, judge)
    for new in (-1,) if not part.hidden else (-4,):
        call = part.call(
            **model_weights(seed=490, device=GENERATE_DEVICE),
            max_len=LONG,
            prompt=_prompt(2, 2, seed=495, device=GENERATE_DEVICE),
            max_new_tokens=new,
            temperature=0.0,
        )
        yield engine.raises(call, "ValueError", "if max_new_tokens < 0")


@dataclass(frozen=True)
class Frequencies:
    """A call that draws the first new token after ``DRAWS`` copies of each of ``prompts`` prompts."""

    temperature: float
    top_k: int | None
    seed: int  # the prompts'
    prompts: int = 2
    quantize: bool = False  # integer logits, so that some tie with the k-th largest
    generator: bool = True  # False: generator=None, torch's global random state


DRAWS = 2000
# the visible part's, then the hidden part's; the seeds are chosen so that every mistake of the hints below
# moves some token's count far outside its bound (see _judge_frequencies): among the 3 most likely at 2.0
# the third keeps about a fifth of the draws, and the quantized prompts have a tie at the k-th largest
FREQUENCIES = (
    (
        Frequencies(0.5, None, 430),
        Frequencies(2.0, 3, 431),
        Frequencies(1.0, 3, 433, prompts=1, quantize=True),
        Frequencies(0.002, VOCAB + 4, 434, generator=False),
    ),
    (
        Frequencies(1.5, 4, 481),
        Frequencies(1.0, 3, 483, prompts=1, quantize=True),
        Frequencies(0.01, VOCAB + 1, 484, generator=False),
    ),
)
#: the largest probability that a right implementation fails generate_sampling's frequencies, both parts
#: together: the budget is shared equally by the frequency calls, then by each call's (prompt, token) counts
#: (Bonferroni), each count held to its Bernstein bound at its share (:func:`_bounds`; 1e-6 / 7 calls / at
#: most 22 counts = 6.5e-9: a bound of at least 6 standard deviations). Measured: the reference's draws, 500
#: seeds for each of the 7 calls, came at most 0.61 of the bound away from draws * p.
FALSE_FAILURE = 1e-6


def _distribution(logits: torch.Tensor, temperature: float, top_k: int | None, strict: bool = False):
    """The next token's distribution ``[prompts, vocab]``: ``softmax(logits / temperature)`` over the logits
    at least the k-th largest (above it with ``strict``) (float64, check code)."""
    scaled = logits.double() / temperature
    if top_k is not None and top_k < scaled.size(-1):
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled <= kth if strict else scaled < kth, -math.inf)
    return torch.softmax(scaled, dim=-1)


def _candidates(logits: torch.Tensor, temperature: float, top_k: int | None) -> Iterator[tuple[str, Any]]:
    """Known mistakes of sampling: ``(hint, distribution)``."""
    if top_k is not None and top_k < VOCAB:
        right = _distribution(logits, temperature, top_k)
        kth = logits.double().topk(top_k, dim=-1).values[:, -1:]
        tied = (logits.double() == kth) & (right > 0)  # [prompts, vocab]
        for index in range(VOCAB):  # one of the tied tokens dropped, exactly k kept
            if (tied.sum(-1) > 1).any() and tied[:, index].any():
                dropped = right.masked_fill(tied & (torch.arange(VOCAB) == index), 0)
                yield TEXT["ties dropped"], dropped / dropped.sum(-1, keepdim=True)
        yield TEXT["top k minus one"], _distribution(logits, temperature, top_k, strict=True)
        yield TEXT["top k plus one"], _distribution(logits, temperature, top_k + 1)
        yield TEXT["top k ignored"], _distribution(logits, temperature, None)
    yield TEXT["temperature ignored"], _distribution(logits, 1.0, top_k)
    yield TEXT["temperature multiplied"], _distribution(logits, 1 / temperature, top_k)
    yield (
        TEXT["temperature after softmax"],
        torch.softmax(_distribution(logits, 1.0, top_k) / temperature, -1),
    )


def _bounds(probabilities: torch.Tensor, draws: int, budget: float) -> torch.Tensor:
    """How far a right implementation's count of each token may stray from ``draws * p``.

    The count is Binomial(draws, p); Bernstein's inequality bounds ``P(|count - draws p| >= t)`` by ``2
    exp(-t^2 / (2 (draws p (1 - p) + t / 3)))``, which equals ``budget`` for ``t = L / 3 + sqrt(L^2 / 9 + 2
    draws p (1 - p) L)``, ``L = ln(2 / budget)``. A token of probability 0 may not be drawn at all."""
    spread = draws * probabilities * (1 - probabilities)
    log = math.log(2 / budget)
    return log / 3 + (log * log / 9 + 2 * spread * log).sqrt()


def _fits(counts: torch.Tensor, probabilities: torch.Tensor, budget: float) -> torch.Tensor:
    """``[prompts, vocab]``: how far each count is outside its bound (> 0: outside; inf: drawn at p = 0)."""
    excess = (counts - DRAWS * probabilities).abs() - _bounds(probabilities, DRAWS, budget)
    return torch.where((probabilities == 0) & (counts > 0), math.inf, excess)


@behaviour(function="generate", points=2, hints=GENERATE_HINTS, driver=GENERATE)
def generate_sampling(part: Part) -> Iterator[Check]:
    """Sampling draws from softmax(logits / temperature) with the generator given (the same seed gives the
    same tokens, another seed other tokens), and with top_k never picks a token outside the k most likely.

    The frequencies of the first new token after many copies of a prompt follow the exact distribution (top_k
    renormalised, the tokens tied with the k-th largest kept, a top_k above the vocabulary keeping every
    token, temperatures from 0.002 to 2, generator=None too); temperature < 0 and top_k < 1 raise
    ValueError."""
    offset = 0 if not part.hidden else 50
    weights = model_weights(seed=420 + offset, device=GENERATE_DEVICE)
    prompt = _prompt(6, 3, seed=425 + offset, device=GENERATE_DEVICE)
    base = {**weights, "max_len": LONG, "prompt": prompt, "max_new_tokens": 6, "temperature": 1.0, "top_k": 3}
    calls = tuple(
        part.call(label, **base, generator=Seeded(seed))
        for label, seed in (
            ("", 1 + offset),
            ("again with the same seed", 1 + offset),
            ("with another seed", 2),
        )
    )
    yield Check(calls, lambda *results: _judge_top_k(results, calls, base))
    budget = FALSE_FAILURE / sum(len(cases) for cases in FREQUENCIES)
    for case in FREQUENCIES[part.hidden]:
        rows = _prompt(case.prompts, 2, seed=case.seed, device=GENERATE_DEVICE).repeat_interleave(
            DRAWS, dim=0
        )
        arguments = {
            **weights,
            "max_len": LONG,
            **({"quantize": True} if case.quantize else {}),
            "prompt": rows,
            "max_new_tokens": 1,
            "temperature": case.temperature,
            "top_k": case.top_k,
        }
        generator = Seeded(7 + offset) if case.generator else None
        call = part.call(**arguments, generator=generator)
        yield Check(
            call, functools.partial(_judge_frequencies, call=call, arguments=arguments, budget=budget)
        )
    errors = ((((-1.0, None), "if temperature < 0"), ((1.0, 0), "if top_k < 1")),)
    errors += ((((-0.5, 3), "if temperature < 0"), ((2.0, -2), "if top_k < 1")),)
    for (temperature, top_k), condition in errors[part.hidden]:
        call = part.call(
            **weights,
            max_len=LONG,
            prompt=_prompt(2, 2, seed=435 + offset, device=GENERATE_DEVICE),
            max_new_tokens=2,
            temperature=temperature,
            top_k=top_k,
            generator=Seeded(3),
        )
        yield engine.raises(call, "ValueError", condition)


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


def _judge_frequencies(result: Any, *, call: Any, arguments: dict[str, Any], budget: float) -> None:
    """The counts of the first new token after each prompt against the exact distribution: each (prompt,
    token) count must stay within its Bernstein bound (:func:`_bounds`) at ``budget`` shared by the counts
    (Bonferroni), so that a right implementation fails with probability below ``budget``; a token of
    probability 0 (outside the top k) may not be drawn at all."""
    prompts = arguments["prompt"][::DRAWS]
    tokens = _tokens(result, call, prompts.size(0) * DRAWS, 2, 1).cpu()
    if not torch.equal(tokens[:, :2], arguments["prompt"].cpu()):
        fail(
            f"the tokens of {call} do not start with the prompt.",
            "return the prompt followed by the new tokens",
        )
    drawn = tokens[:, -1].long()
    if ((drawn < 0) | (drawn >= VOCAB)).any():
        fail(f"{call} drew a token outside the vocabulary, 0 to {VOCAB - 1}.")
    counts = F.one_hot(drawn, VOCAB).double().reshape(-1, DRAWS, VOCAB).sum(1)  # [prompts, vocab]
    with torch.no_grad():
        logits = _model(arguments)(prompts)[:, -1].double().cpu()
    temperature, top_k = arguments["temperature"], arguments["top_k"]
    right = _distribution(logits, temperature, top_k)
    share = budget / counts.numel()  # Bonferroni: each count's share of the call's budget
    excess = _fits(counts, right, share)
    if (excess <= 0).all():
        return
    cause = next(
        (hint for hint, p in _candidates(logits, temperature, top_k) if (_fits(counts, p, share) <= 0).all()),
        "",
    )
    row, token = divmod(int(excess.flatten().argmax()), VOCAB)
    count, p = int(counts[row, token]), right[row, token].item()
    what = f"softmax(logits / {temperature:g})" + (f" with top_k={top_k}" if top_k is not None else "")
    seen = [round(c / DRAWS, 3) for c in counts[row].tolist()]
    expected = [round(q, 3) for q in right[row].tolist()]
    if p == 0:
        message = f"token {token} was drawn {count} times although {what} gives it probability 0"
        cause = cause or TEXT["not top k"]
    else:
        bound = _bounds(right[row, token], DRAWS, share).item()
        message = (
            f"token {token} was drawn {count} times where {what} expects {DRAWS * p:.0f} (a right "
            f"implementation stays within {bound:.0f} of it but once in a million)"
        )
    fail(
        f"the first new tokens of {call} do not follow {what}: after prompt {prompts[row].tolist()}, "
        f"{message}; frequencies {seen}, expected {expected} ({DRAWS} draws).",
        cause,
    )
