"""The transformer block and a tiny decoder-only language model (chapter 7), with text generation.

A block is self-attention and a position-wise feed-forward network, each wrapped in a residual connection and
a layer normalisation. Where the normalisation sits is the difference between the two blocks in use:

- post-LN (Vaswani et al. 2017, BERT): ``x = LN(x + Dropout(Sublayer(x)))``;
- pre-LN (GPT-2, and most current decoders): ``x = x + Dropout(Sublayer(LN(x)))``, with one more ``LN`` after
  the last block. Xiong et al. 2020 ("On Layer Normalization in the Transformer Architecture") show that the
  gradients of post-LN's last layers are large at initialisation, hence its learning-rate warm-up; pre-LN's
  are well-behaved without it.

:class:`TinyGPT` stacks pre-LN blocks under token and learned position embeddings, as GPT-2 does;
:func:`load_gpt2_weights` copies Hugging Face's ``GPT2LMHeadModel`` into it, and a test checks equal logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attention_course.multi_head import MultiHeadAttention


class TransformerBlock(nn.Module):
    """One encoder block (or, with a causal mask, one decoder-only block): self-attention, then a feed-forward
    network, each with a residual connection and a layer normalisation.

    Sub-modules are named as in ``nn.TransformerEncoderLayer``: ``self_attn`` (chapter 4's
    :class:`~attention_course.multi_head.MultiHeadAttention`), ``linear1`` (``d_model -> d_ff``), ``linear2``
    (``d_ff -> d_model``), ``norm1``, ``norm2``. Dropout with probability ``dropout`` (while training) on each
    sub-layer's output before the residual sum, as Vaswani et al. put it (section 5.4, "residual dropout"),
    and after the activation inside the feed-forward network, as PyTorch does. Parameters:
    ``4 d_model^2 + 4 d_model`` (attention) ``+ 2 d_model d_ff + d_ff + d_model`` (feed-forward) ``+ 4
    d_model`` (two layer norms): :func:`block_parameter_count`.

    Args:
        d_model: the model width.
        n_heads: the number of heads, a divisor of ``d_model``.
        d_ff: the inner width of the feed-forward network (``4 d_model`` in the paper and in GPT-2).
        norm_first: pre-LN if True, post-LN (the paper's) if False.
        dropout: the dropout probability, in ``[0, 1)``.
        activation: ``"relu"`` (the paper's) or ``"gelu"`` (BERT's and GPT-2's): the exact GELU, ``F.gelu``,
            as ``nn.TransformerEncoderLayer(activation="gelu")``.

    Raises:
        ValueError: if ``n_heads`` does not divide ``d_model``, or the activation is unknown.

    Source: Vaswani et al. 2017, sections 3.1, 3.3 and 5.4; Xiong et al. 2020 (pre-LN); PyTorch's
    ``nn.TransformerEncoderLayer``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        norm_first: bool = False,
        dropout: float = 0.0,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        if activation not in ("relu", "gelu"):
            raise ValueError(
                f"activation must be 'relu' or 'gelu', got {activation!r}"
            )
        self.norm_first = norm_first
        # GELU: the exact one, not tanh's
        self.activation = F.gelu if activation == "gelu" else F.relu
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Apply the block.

        Args:
            x: ``[batch, len, d_model]``, the dtype and device of the parameters.
            mask: boolean, ``True`` = may attend, broadcastable to ``[batch, n_heads, len, len]`` (a causal
                mask ``[len, len]``, a padding mask ``[batch, 1, 1, len]``, or both combined); ``None``: no
                mask, every query attends every key (the block adds no causal mask of its own).

        Returns:
            ``[batch, len, d_model]``, in ``x``'s dtype.
        """
        if self.norm_first:
            x = x + self._attention(self.norm1(x), mask)
            return x + self._feed_forward(self.norm2(x))
        x = self.norm1(x + self._attention(x, mask))
        return self.norm2(x + self._feed_forward(x))

    def _attention(
        self, x: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        return self.dropout(self.self_attn(x, x, x, mask)[0])

    def _feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        # [batch, len, d_ff]
        hidden = self.dropout(self.activation(self.linear1(x)))
        return self.dropout(self.linear2(hidden))


def block_parameter_count(d_model: int, d_ff: int) -> int:
    """The parameters of one :class:`TransformerBlock` (biases and layer norms included).

    ``4 d^2 + 4 d`` (attention) + ``2 d d_ff + d_ff + d`` (feed-forward) + ``4 d`` (two layer norms). For the
    paper's base model (``d_model = 512``, ``d_ff = 2048``): 3,152,384, as ``nn.TransformerEncoderLayer``.

    Source: Vaswani et al. 2017, sections 3.2.2 and 3.3.
    """
    return (
        4 * d_model * d_model
        + 4 * d_model
        + 2 * d_model * d_ff
        + d_ff
        + d_model
        + 4 * d_model
    )


def load_torch_encoder_layer(
    block: TransformerBlock, torch_layer: nn.TransformerEncoderLayer
) -> TransformerBlock:
    """Copy the weights of ``nn.TransformerEncoderLayer`` into the course's :class:`TransformerBlock`.

    Args:
        block: the course's block, of the same sizes and activation.
        torch_layer: ``nn.TransformerEncoderLayer(d_model, n_heads, d_ff, batch_first=True)``, biases on.

    Returns:
        ``block``, its parameters overwritten in place.

    Raises:
        ValueError: if the sizes or the activations differ.

    Source: PyTorch's ``nn.TransformerEncoderLayer`` (its sub-module names).
    """
    if block.linear1.weight.shape != torch_layer.linear1.weight.shape:
        raise ValueError(
            "the feed-forward widths differ: "
            f"{list(block.linear1.weight.shape)} and "
            f"{list(torch_layer.linear1.weight.shape)}"
        )
    theirs = getattr(torch_layer, "activation", F.relu)
    if (block.activation is F.gelu) != (
        theirs is F.gelu or isinstance(theirs, nn.GELU)
    ):
        raise ValueError("the activations differ (relu and gelu)")
    block.self_attn.load_torch_weights(torch_layer.self_attn)
    for name in ("linear1", "linear2", "norm1", "norm2"):
        getattr(block, name).load_state_dict(
            getattr(torch_layer, name).state_dict()
        )
    return block


class TinyGPT(nn.Module):
    """A decoder-only language model in GPT-2's layout: token and learned position embeddings, pre-LN blocks
    with a causal mask and GELU, a final layer norm, and an output layer tied to the token embedding.

    Args:
        vocab_size: the number of tokens.
        d_model: the model width.
        n_heads: heads per block, a divisor of ``d_model``.
        n_layers: the number of blocks.
        d_ff: the feed-forward network's inner width.
        max_len: the longest sequence (the number of learned positions).
        dropout: dropout on the embeddings' sum and inside the blocks, while training.

    Source: Radford et al. 2019 ("Language Models are Unsupervised Multitask Learners", section 2.3: pre-LN, a
    final layer norm); Hugging Face ``transformers``' ``GPT2LMHeadModel``.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        d_ff: int = 256,
        max_len: int = 128,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.max_len = max_len
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                d_model,
                n_heads,
                d_ff,
                norm_first=True,
                dropout=dropout,
                activation="gelu",
            )
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        # tied, as in GPT-2 (Press and Wolf 2017)
        self.lm_head.weight = self.token_embedding.weight
        # GPT-2's N(0, 0.02) and zero biases, without its 1/sqrt(2 n_layers)
        # scaling of residual projections
        for name, parameter in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(parameter)
            elif parameter.dim() > 1:
                nn.init.normal_(parameter, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """The logits of the next token at every position.

        Args:
            tokens: ``[batch, len]`` integer token ids, ``len <= max_len``.

        Returns:
            ``[batch, len, vocab_size]`` logits (position ``t`` predicts token ``t + 1``).

        Raises:
            ValueError: if the sequence is longer than ``max_len``.
        """
        length = tokens.size(1)
        if length > self.max_len:
            raise ValueError(
                f"the sequence has {length} tokens, more than "
                f"max_len={self.max_len}"
            )
        positions = torch.arange(length, device=tokens.device)
        x = self.dropout(
            self.token_embedding(tokens)
            + self.position_embedding(positions)
        )
        causal = torch.ones(
            length, length, dtype=torch.bool, device=tokens.device
        ).tril()  # True = may attend
        for block in self.blocks:
            x = block(x, causal)
        return self.lm_head(self.norm(x))


def load_gpt2_weights(model: TinyGPT, gpt2: nn.Module) -> TinyGPT:
    """Copy the weights of Hugging Face's ``GPT2LMHeadModel`` into :class:`TinyGPT` of the same sizes.

    GPT-2 keeps its linear layers as ``Conv1D`` (``y = x W + b``, ``W`` of shape ``[in, out]``), the transpose
    of ``nn.Linear``'s ``[out, in]``; its attention stacks ``W_q, W_k, W_v`` column-wise in ``c_attn``.

    Args:
        model: the course's model.
        gpt2: ``transformers.GPT2LMHeadModel`` with ``activation_function="gelu"`` and the same sizes.

    Returns:
        ``model``, its parameters overwritten in place.

    Source: Hugging Face ``transformers``, ``models/gpt2/modeling_gpt2.py``.
    """
    body = gpt2.transformer
    with torch.no_grad():
        model.token_embedding.weight.copy_(body.wte.weight)
        model.position_embedding.weight.copy_(
            body.wpe.weight[: model.max_len]
        )
        for block, layer in zip(model.blocks, body.h, strict=True):
            attention = block.self_attn
            for projection, weight, bias in zip(
                (attention.w_q, attention.w_k, attention.w_v),
                # [3 d_model, d_model]: rows of W_q, W_k, W_v
                layer.attn.c_attn.weight.T.chunk(3),
                layer.attn.c_attn.bias.chunk(3),
                strict=True,
            ):
                projection.weight.copy_(weight)
                projection.bias.copy_(bias)
            pairs = (
                (attention.w_o, layer.attn.c_proj),
                (block.linear1, layer.mlp.c_fc),
                (block.linear2, layer.mlp.c_proj),
            )
            for linear, conv in pairs:
                linear.weight.copy_(conv.weight.T)
                linear.bias.copy_(conv.bias)
            block.norm1.load_state_dict(layer.ln_1.state_dict())
            block.norm2.load_state_dict(layer.ln_2.state_dict())
        model.norm.load_state_dict(body.ln_f.state_dict())
    return model


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Extend ``prompt`` by ``max_new_tokens`` tokens, one at a time, each drawn from the model's distribution
    of the next token given all the tokens so far.

    At each step the whole sequence so far (its last ``model.max_len`` tokens, if the model has that
    attribute) goes through the model; the logits of the last position are divided by ``temperature``; with
    ``top_k``, all but the ``k`` largest are set to ``-inf``; the next token is drawn from their softmax with
    ``torch.multinomial`` (logits tied with the ``k``-th largest are kept too). ``temperature == 0`` is greedy
    decoding: the argmax, no randomness.

    Args:
        model: maps ``[batch, len]`` token ids to ``[batch, len, vocab]`` logits (a causal model).
        prompt: ``[batch, prompt_len]`` integer token ids, ``prompt_len >= 1``.
        max_new_tokens: how many tokens to add, at least 0 (0: the prompt itself).
        temperature: ``0`` (greedy) or any positive number; below 1 sharpens the distribution, above 1
            flattens it.
        top_k: keep the ``top_k`` most likely tokens only, and those tied with the ``top_k``-th (``None``, or
            a ``top_k`` at least the vocabulary's size: every token).
        generator: the random generator for sampling (its device is that of the sampled probabilities'; a CPU
            generator samples on the CPU); ``None``: torch's global random state.

    Returns:
        ``[batch, prompt_len + max_new_tokens]`` in the prompt's dtype (``torch.long``): the prompt, then the
        new tokens.

    Raises:
        ValueError: if ``temperature < 0``, ``top_k < 1`` or ``max_new_tokens < 0``.

    Source: Holtzman et al. 2020 ("The Curious Case of Neural Text Degeneration", on temperature and top-k);
    Fan et al. 2018 (top-k sampling).
    """
    if (
        temperature < 0
        or (top_k is not None and top_k < 1)
        or max_new_tokens < 0
    ):
        raise ValueError(
            "need temperature >= 0, top_k >= 1 and max_new_tokens >= 0, "
            f"got {temperature}, {top_k}, "
            f"{max_new_tokens}"
        )
    tokens = prompt
    window = getattr(model, "max_len", None)
    for _ in range(max_new_tokens):
        context = tokens if window is None else tokens[:, -window:]
        # [batch, vocab]: the next token's logits
        logits = model(context)[:, -1, :]
        if temperature == 0:
            next_token = logits.argmax(dim=-1, keepdim=True)  # [batch, 1]
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.size(-1):
                # [batch, 1], the k-th largest
                kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probabilities = torch.softmax(logits.float(), dim=-1)
            if generator is not None:
                probabilities = probabilities.to(generator.device)
            next_token = torch.multinomial(
                probabilities, 1, generator=generator
            ).to(tokens.device)
        tokens = torch.cat([tokens, next_token], dim=1)
    return tokens
