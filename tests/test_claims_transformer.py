"""The checkable claims of chapter 7 (the transformer block, post-LN and pre-LN, a tiny GPT, generation).

Expected values come from PyTorch (``nn.TransformerEncoderLayer``, ``nn.MultiheadAttention``), from Hugging
Face's ``GPT2LMHeadModel`` built from a config with random weights (no download), from closed-form numbers,
or from loops written here, never from the course's code alone. The chapter asserts the same claims as it
runs; these tests keep them true when it is edited.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention_course.device import seeded_generator
from attention_course.masks import causal_mask, combine_masks, padding_mask
from attention_course.transformer import (
    TinyGPT,
    TransformerBlock,
    block_parameter_count,
    generate,
    load_gpt2_weights,
    load_torch_encoder_layer,
)


def parameter_count(module: nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


def randomized(module: nn.Module, seed: int) -> nn.Module:
    """``module`` in float64 and eval mode, every parameter drawn from a seeded generator (layer norm gains
    around 1), so that the layer norms' gains and biases are exercised too."""
    module = module.double().eval()
    generator = seeded_generator(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            drawn = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            drawn = drawn / math.sqrt(parameter.shape[-1])
            parameter.copy_(1 + drawn if "norm" in name and name.endswith("weight") else drawn)
    return module


# --- parameters ---


def test_base_block_has_3152384_parameters():
    attention = 4 * 512**2 + 4 * 512
    feed_forward = 2 * 512 * 2048 + 2048 + 512
    layer_norms = 4 * 512
    assert (attention, feed_forward, layer_norms) == (1_050_624, 2_099_712, 2_048)
    assert attention + feed_forward + layer_norms == 3_152_384
    assert parameter_count(nn.TransformerEncoderLayer(512, 8)) == 3_152_384  # dim_feedforward=2048 default
    assert block_parameter_count(512, 2048) == 3_152_384
    assert parameter_count(TransformerBlock(512, 8, 2048)) == 3_152_384


@pytest.mark.parametrize(("d_model", "n_heads", "d_ff"), [(16, 4, 40), (24, 3, 96), (64, 1, 256)])
def test_block_parameter_count_matches_torch(d_model, n_heads, d_ff):
    expected = parameter_count(nn.TransformerEncoderLayer(d_model, n_heads, d_ff))
    assert block_parameter_count(d_model, d_ff) == expected
    assert parameter_count(TransformerBlock(d_model, n_heads, d_ff)) == expected


# --- the course's block is nn.TransformerEncoderLayer ---

SIZES = [  # batch, length, d_model, n_heads, d_ff: every size different
    (3, 7, 16, 4, 40),
    (2, 5, 12, 3, 20),
    (4, 9, 8, 2, 24),
]


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("sizes", SIZES, ids=str)
def test_block_equals_torch_encoder_layer_with_causal_and_padding_masks(sizes, norm_first, activation):
    batch, length, d_model, n_heads, d_ff = sizes
    seed = sum(sizes) + norm_first
    torch_layer = nn.TransformerEncoderLayer(
        d_model, n_heads, d_ff, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    )
    torch_layer = randomized(torch_layer, seed)
    block = TransformerBlock(d_model, n_heads, d_ff, norm_first=norm_first, activation=activation).double()
    load_torch_encoder_layer(block, torch_layer).eval()

    lengths = torch.randint(1, length + 1, (batch,), generator=seeded_generator(seed))
    lengths[0] = length  # one sequence without padding
    tokens = (torch.arange(length)[None, :] < lengths[:, None]).long()  # [batch, len], 0 = padding
    keep = padding_mask(tokens)  # [batch, 1, 1, len], True = a real token
    causal = causal_mask(length)  # [1, 1, len, len], True = may attend
    x = torch.randn(batch, length, d_model, generator=seeded_generator(seed + 1), dtype=torch.float64)
    with torch.no_grad():
        # PyTorch: True = blocked
        expected = torch_layer(x, src_mask=~causal[0, 0], src_key_padding_mask=~keep[:, 0, 0, :])
        output = block(x, combine_masks(causal, keep))
        torch.testing.assert_close(output, expected, atol=1e-12, rtol=0)
        # the causal mask alone, and no mask at all
        expected = torch_layer(x, src_mask=~causal[0, 0])
        torch.testing.assert_close(block(x, causal), expected, atol=1e-12, rtol=0)
        torch.testing.assert_close(block(x), torch_layer(x), atol=1e-12, rtol=0)
        # the masks matter: without them the outputs differ
        assert not torch.allclose(block(x), block(x, combine_masks(causal, keep)), atol=1e-6)


def test_post_ln_output_is_normalised_and_pre_ln_keeps_the_residual_scale():
    d_model = 16
    post = TransformerBlock(d_model, 4, 64, norm_first=False).double().eval()
    pre = TransformerBlock(d_model, 4, 64, norm_first=True).double().eval()
    pre.load_state_dict(post.state_dict())
    x = 1 + 3 * torch.randn(2, 7, d_model, generator=seeded_generator(3), dtype=torch.float64)
    with torch.no_grad():
        post_y, pre_y = post(x), pre(x)
        # the pre-LN block's first sub-layer is x + A(LN(x)), not LN(x + A(x))
        attention = pre.self_attn
        normed = F.layer_norm(x, (d_model,))  # norm1 at initialisation: gain 1, bias 0
        residual = x + attention(normed, normed, normed)[0]
        hidden = F.relu(F.layer_norm(residual, (d_model,)) @ pre.linear1.weight.T + pre.linear1.bias)
        torch.testing.assert_close(pre_y, residual + hidden @ pre.linear2.weight.T + pre.linear2.bias)
        assert (residual - F.layer_norm(x + attention(x, x, x)[0], (d_model,))).abs().max() > 1
    assert post_y.mean(dim=-1).abs().max() < 1e-12
    torch.testing.assert_close(
        post_y.var(dim=-1, unbiased=False), torch.ones(2, 7, dtype=torch.float64), atol=1e-4, rtol=0
    )
    assert pre_y.std(dim=-1).mean() > 2


# --- dropout ---


def test_attention_weights_are_post_dropout_in_training_mode():
    torch.manual_seed(0)
    torch_mha = nn.MultiheadAttention(16, 4, dropout=0.5, batch_first=True)
    x = torch.randn(8, 10, 16, generator=seeded_generator(1))
    _, train_weights = torch_mha.train()(x, x, x, average_attn_weights=False)
    with torch.no_grad():
        _, eval_weights = torch_mha.eval()(x, x, x, average_attn_weights=False)
    eval_sums, train_sums = eval_weights.sum(dim=-1), train_weights.sum(dim=-1)
    assert (eval_sums - 1).abs().max() < 1e-6
    assert not torch.allclose(train_sums, torch.ones_like(train_sums), atol=0.1)  # rows do not sum to 1
    assert train_sums.min() < 0.5 and train_sums.max() > 1.5
    kept = train_weights != 0
    assert 0.4 < kept.float().mean() < 0.6
    torch.testing.assert_close(train_weights[kept], 2 * eval_weights[kept], atol=1e-6, rtol=0)


def test_block_dropout_is_active_in_training_mode_only():
    torch.manual_seed(0)
    block = TransformerBlock(16, 4, 64, dropout=0.3)
    plain = TransformerBlock(16, 4, 64, dropout=0.0)
    plain.load_state_dict(block.state_dict())
    x = torch.randn(2, 5, 16, generator=seeded_generator(2))
    with torch.no_grad():
        assert not torch.allclose(block.train()(x), block.train()(x))  # a new mask each call
        torch.testing.assert_close(block.eval()(x), plain.eval()(x), atol=0, rtol=0)


# --- the tiny GPT is GPT-2 ---


@pytest.mark.parametrize(
    ("vocab_size", "d_model", "n_heads", "n_layers", "max_len"), [(24, 64, 4, 2, 64), (11, 48, 3, 3, 20)]
)
def test_tiny_gpt_equals_gpt2_lm_head_model(vocab_size, d_model, n_heads, n_layers, max_len):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=max_len,
        n_embd=d_model,
        n_layer=n_layers,
        n_head=n_heads,
        activation_function="gelu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(vocab_size)
    gpt2 = GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # GPT-2 starts with zero biases and unit gains: perturb them so they are tested
        for name, parameter in gpt2.named_parameters():
            if parameter.dim() == 1:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=seeded_generator(len(name))))
    course = load_gpt2_weights(
        TinyGPT(vocab_size, d_model, n_heads, n_layers, 4 * d_model, max_len), gpt2
    ).eval()
    tokens = torch.randint(vocab_size, (3, max_len), generator=seeded_generator(5))
    with torch.no_grad():
        expected, logits = gpt2(tokens).logits, course(tokens)
    assert logits.dtype == torch.float32 and logits.shape == (3, max_len, vocab_size)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    assert parameter_count(course) == parameter_count(gpt2)
    assert course.lm_head.weight is course.token_embedding.weight  # tied, as GPT-2's


# --- generation ---


def argmax_loop(model: nn.Module, prompt: torch.Tensor, max_new_tokens: int, window: int) -> torch.Tensor:
    """Greedy decoding written out: the argmax of the last position's logits, the last `window` tokens as
    context."""
    tokens = prompt
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(tokens[:, -window:])  # [batch, len, vocab]
            tokens = torch.cat([tokens, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return tokens


@pytest.mark.parametrize(("prompt_len", "max_new_tokens"), [(1, 10), (5, 20)])
def test_greedy_generation_equals_an_argmax_loop(prompt_len, max_new_tokens):
    torch.manual_seed(prompt_len)
    model = TinyGPT(13, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=16).eval()
    with torch.no_grad():  # larger weights than GPT-2's initialisation, so that the argmax varies
        for parameter in model.parameters():
            parameter.mul_(10)
    prompt = torch.randint(13, (3, prompt_len), generator=seeded_generator(prompt_len))
    tokens = generate(model, prompt, max_new_tokens, temperature=0)
    assert tokens.shape == (3, prompt_len + max_new_tokens)
    assert torch.equal(tokens[:, :prompt_len], prompt)
    assert torch.equal(tokens, argmax_loop(model, prompt, max_new_tokens, window=16))  # past max_len too
    assert len(tokens[:, prompt_len:].unique()) > 1


class FixedLogits(nn.Module):
    """A 'model' whose next-token logits are one fixed row per sequence, whatever the context."""

    def __init__(self, logits: torch.Tensor):  # [batch, vocab]
        super().__init__()
        self.logits = logits

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        batch, length = tokens.shape
        return self.logits[:batch, None, :].expand(batch, length, -1)  # [batch, len, vocab]


def test_top_k_sampling_only_picks_the_k_largest():
    vocab, k = 12, 3
    logits = torch.randn(4, vocab, generator=seeded_generator(7))  # [batch, vocab]
    model = FixedLogits(logits)
    prompt = torch.zeros(4, 1, dtype=torch.long)
    tokens = generate(model, prompt, 300, temperature=1.5, top_k=k, generator=seeded_generator(8))[:, 1:]
    top = logits.topk(k, dim=-1).indices  # [batch, k]
    for row in range(4):
        assert set(tokens[row].tolist()) == set(top[row].tolist())  # each of the k, and only them
    greedy = generate(model, prompt, 5, temperature=0)[:, 1:]
    assert torch.equal(greedy, logits.argmax(dim=-1, keepdim=True).expand(4, 5))
    top_1 = generate(model, prompt, 5, temperature=2.0, top_k=1, generator=seeded_generator(9))[:, 1:]
    assert torch.equal(top_1, greedy)


def test_temperature_sampling_follows_the_softmax_of_the_scaled_logits():
    vocab, draws, temperature = 6, 20_000, 0.7
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5, 2.0, -1.0]])
    model = FixedLogits(logits.expand(draws, vocab))
    prompt = torch.zeros(draws, 1, dtype=torch.long)
    tokens = generate(model, prompt, 1, temperature=temperature, generator=seeded_generator(10))[:, 1]
    frequencies = torch.bincount(tokens, minlength=vocab).double() / draws
    expected = torch.softmax(logits[0].double() / temperature, dim=-1)
    assert (frequencies - expected).abs().max() < 0.015  # about 4 standard errors at most
    # the same generator seed gives the same draws
    again = generate(model, prompt, 1, temperature=temperature, generator=seeded_generator(10))[:, 1]
    assert torch.equal(tokens, again)


def test_generate_rejects_bad_arguments():
    model = FixedLogits(torch.zeros(1, 5))
    prompt = torch.zeros(1, 1, dtype=torch.long)
    for arguments in ({"temperature": -1.0}, {"top_k": 0}):
        with pytest.raises(ValueError):
            generate(model, prompt, 3, **arguments)
    with pytest.raises(ValueError):
        generate(model, prompt, -1)


# --- post-LN and pre-LN at initialisation (Xiong et al. 2020) ---


def last_ffn_gradient_norm(norm_first: bool, n_layers: int, seed: int) -> float:
    """||dLoss/dW_2|| of the last block at initialisation (Xavier, zero biases) of a small causal language
    model built here from the course's blocks, on random tokens."""
    vocab, d_model, length = 24, 32, 32
    torch.manual_seed(seed)
    embedding, positions = nn.Embedding(vocab, d_model), nn.Embedding(length, d_model)
    blocks = nn.ModuleList(
        TransformerBlock(d_model, 4, 4 * d_model, norm_first=norm_first) for _ in range(n_layers)
    )
    final_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()  # GPT-2's final layer norm
    output = nn.Linear(d_model, vocab)
    for module in (blocks, output):
        for name, parameter in module.named_parameters():
            if parameter.dim() == 2:
                nn.init.xavier_uniform_(parameter)
            elif name.endswith("bias"):
                nn.init.zeros_(parameter)
    tokens = torch.randint(vocab, (16, length + 1), generator=seeded_generator(100 + seed))
    x = embedding(tokens[:, :-1]) + positions(torch.arange(length))
    for block in blocks:
        x = block(x, causal_mask(length))
    F.cross_entropy(output(final_norm(x)).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    return blocks[-1].linear2.weight.grad.norm().item()


def test_post_ln_last_layer_gradient_is_larger_at_initialisation():
    ratios = {}
    for n_layers in (2, 6, 12):
        post = torch.tensor([last_ffn_gradient_norm(False, n_layers, seed) for seed in range(3)])
        pre = torch.tensor([last_ffn_gradient_norm(True, n_layers, seed) for seed in range(3)])
        assert (post > 1.5 * pre).all(), (n_layers, post, pre)  # every seed
        ratios[n_layers] = (post / pre).mean().item()
    assert ratios[12] > ratios[2]  # the gap widens with depth
