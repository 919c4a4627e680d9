"""The checkable claims that chapter 6 (cross-attention) teaches.

Shapes and the source's permutation invariance (C27), the boolean decoder mask (C28), the decoder layer, the
cache of the source's keys and values, the source padding mask, ALBEF's order inside a fusion layer, and the
size of the gradient under near-uniform weights. Expected values come from PyTorch (``nn.MultiheadAttention``,
``nn.TransformerDecoderLayer``, ``F.scaled_dot_product_attention``), from Hugging Face's ``transformers``
(``BertLayer`` with cross-attention, random weights, no download) or from matrices written by hand, never from
the course's code alone. The chapter asserts the same claims as it runs; these tests keep them true when it is
edited.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention_course.cross_attention import CrossAttention, DecoderLayer, load_torch_decoder_layer
from attention_course.device import seeded_generator
from attention_course.masks import causal_mask, combine_masks, padding_mask
from attention_course.multi_head import split_heads


def randn(*shape: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=seeded_generator(seed), dtype=torch.float64).to(dtype)


def randomized(module: nn.Module, seed: int, dtype=torch.float64) -> nn.Module:
    """``module`` in ``dtype`` and eval mode, every parameter drawn from a seeded generator."""
    module = module.to(dtype).eval()
    generator = seeded_generator(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            drawn = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            parameter.copy_(drawn / math.sqrt(parameter.shape[-1]))
    return module


def torch_and_course_cross_attention(d_model: int, n_heads: int, seed: int, dtype=torch.float64):
    """``nn.MultiheadAttention(batch_first=True)``, random weights; the course's CrossAttention given them."""
    torch_mha = randomized(nn.MultiheadAttention(d_model, n_heads, batch_first=True), seed, dtype)
    course = CrossAttention(d_model, n_heads).to(dtype).eval()
    course.load_torch_weights(torch_mha)
    return torch_mha, course


def torch_and_course_decoder(d_model: int, n_heads: int, d_ff: int, norm_first: bool, seed: int):
    """``nn.TransformerDecoderLayer`` (float64, no dropout), random weights; the course's layer given them."""
    torch_layer = nn.TransformerDecoderLayer(
        d_model, n_heads, d_ff, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    torch_layer = randomized(torch_layer, seed)
    course = DecoderLayer(d_model, n_heads, d_ff, norm_first=norm_first).double()
    return torch_layer, load_torch_decoder_layer(course, torch_layer).eval()


# --- C27: queries from the target, keys and values from the source ---


def test_c27_cross_attention_shapes_and_torch_equality():
    batch, tgt_len, src_len, d_model, n_heads = 2, 10, 15, 512, 8
    torch_mha, course = torch_and_course_cross_attention(d_model, n_heads, seed=1, dtype=torch.float32)
    target, source = randn(batch, tgt_len, d_model, seed=2), randn(batch, src_len, d_model, seed=3)
    target, source = target.float(), source.float()
    with torch.no_grad():
        expected, expected_weights = torch_mha(target, source, source, average_attn_weights=False)
        output, weights = course(target, source)
    assert tuple(output.shape) == (2, 10, 512) and tuple(weights.shape) == (2, 8, 10, 15)
    assert tuple(expected_weights.shape) == (
        2,
        8,
        10,
        15,
    )  # [batch, n_heads, tgt_len, src_len] in PyTorch too
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=0)
    # the roles swapped: one row per source position, another function altogether
    with torch.no_grad():
        swapped, swapped_weights = course(source, target)
    assert tuple(swapped.shape) == (2, 15, 512) and tuple(swapped_weights.shape) == (2, 8, 15, 10)


def test_c27_permuting_the_source_permutes_the_columns_and_keeps_the_output():
    batch, tgt_len, src_len, d_model, n_heads = 2, 10, 15, 512, 8
    torch_mha, course = torch_and_course_cross_attention(d_model, n_heads, seed=4, dtype=torch.float32)
    target, source = (
        randn(batch, tgt_len, d_model, seed=5).float(),
        randn(batch, src_len, d_model, seed=6).float(),
    )
    permutation = torch.randperm(src_len, generator=seeded_generator(7))
    shuffled = source[:, permutation]  # keys and values permuted together
    assert not torch.equal(permutation, torch.arange(src_len))
    with torch.no_grad():
        output, weights = course(target, source)
        permuted, permuted_weights = course(target, shuffled)
        # PyTorch's module has the same property
        expected, expected_weights = torch_mha(target, source, source, average_attn_weights=False)
        torch_permuted, torch_permuted_weights = torch_mha(
            target, shuffled, shuffled, average_attn_weights=False
        )
        # permuting the keys but not the values does change the output: the invariance needs both
        keys_only, _ = torch_mha(target, shuffled, source)
    torch.testing.assert_close(permuted, output, atol=1e-6, rtol=0)
    torch.testing.assert_close(permuted_weights, weights[..., permutation], atol=1e-6, rtol=0)
    torch.testing.assert_close(torch_permuted, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(torch_permuted_weights, expected_weights[..., permutation], atol=1e-6, rtol=0)
    assert (keys_only - expected).abs().max() > 1e-2


def test_the_scale_is_one_over_sqrt_d_head_and_no_parameter():
    d_model, n_heads = 48, 6
    course = randomized(CrossAttention(d_model, n_heads), seed=8)
    assert [name for name, _ in course.named_parameters()] == [
        f"{projection}.{kind}" for projection in ("w_q", "w_k", "w_v", "w_o") for kind in ("weight", "bias")
    ]
    target, source = randn(2, 4, d_model, seed=9), randn(2, 7, d_model, seed=10)
    with torch.no_grad():
        output, weights = course(target, source)
        q, k, v = (
            split_heads(w(x), n_heads)
            for w, x in ((course.w_q, target), (course.w_k, source), (course.w_v, source))
        )
        sdpa = F.scaled_dot_product_attention(q, k, v)  # PyTorch's default scale: 1/sqrt(d_head)
        expected = course.w_o(sdpa.transpose(1, 2).reshape(2, 4, d_model))
    torch.testing.assert_close(output, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        weights,
        torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_model // n_heads), -1),
        atol=1e-12,
        rtol=0,
    )


# --- masks ---


def test_c28_float_tril_and_bool_raises_and_bool_and_bool_gives_the_decoder_mask():
    tokens = torch.tensor([[5, 7, 4, 9, 3], [6, 3, 8, 0, 0]])
    pad = padding_mask(tokens)  # [batch, 1, 1, 5]
    with pytest.raises(NotImplementedError, match="not implemented for 'Float'"):
        torch.tril(torch.ones(5, 5)) & pad
    mask = torch.tril(torch.ones(5, 5, dtype=torch.bool)) & pad
    expected_second = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]],
        dtype=torch.bool,
    )
    assert mask.shape == (2, 1, 5, 5)
    assert torch.equal(mask[0, 0], torch.tensor([[j <= i for j in range(5)] for i in range(5)]))
    assert torch.equal(mask[1, 0], expected_second)
    assert torch.equal(combine_masks(causal_mask(5), pad), mask)
    with pytest.raises(TypeError):
        combine_masks(causal_mask(5), pad.float())


@pytest.mark.parametrize("sizes", [(2, 10, 15, 24, 3), (3, 4, 9, 16, 4), (1, 6, 3, 8, 2)], ids=str)
def test_source_padding_gets_exactly_zero_weight(sizes):
    batch, tgt_len, src_len, d_model, n_heads = sizes
    torch_mha, course = torch_and_course_cross_attention(d_model, n_heads, seed=sum(sizes))
    target, source = randn(batch, tgt_len, d_model, seed=11), randn(batch, src_len, d_model, seed=12)
    lengths = torch.tensor([src_len, max(1, src_len - 2), 1])[:batch]
    keep = torch.arange(src_len) < lengths[:, None]  # [batch, src_len], True = real token
    with torch.no_grad():
        output, weights = course(target, source, keep[:, None, None, :])
        expected, expected_weights = torch_mha(
            target, source, source, key_padding_mask=~keep, average_attn_weights=False
        )
        # whatever the padded positions hold, the real outputs do not change
        garbage = torch.where(keep[..., None], source, 1e3 * randn(batch, src_len, d_model, seed=13))
        with_garbage, _ = course(target, garbage, keep[:, None, None, :])
    assert (weights.masked_select(~keep[:, None, None, :]) == 0).all()  # exactly zero, not small
    torch.testing.assert_close(weights.sum(-1), torch.ones(batch, n_heads, tgt_len, dtype=torch.float64))
    torch.testing.assert_close(output, expected, atol=1e-10, rtol=0)
    torch.testing.assert_close(weights, expected_weights, atol=1e-10, rtol=0)
    torch.testing.assert_close(with_garbage, output, atol=1e-10, rtol=0)


def test_a_causal_mask_of_tgt_len_by_src_len_has_two_alignments():
    """tril(ones(t, s)), the top-left triangle of SDPA's is_causal, differs from the bottom-right one."""
    q, k, v = randn(1, 1, 4, 8, seed=14), randn(1, 1, 6, 8, seed=15), randn(1, 1, 6, 8, seed=16)
    top_left = torch.ones(4, 6, dtype=torch.bool).tril()
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
        F.scaled_dot_product_attention(q, k, v, attn_mask=top_left),
        atol=1e-12,
        rtol=0,
    )
    bottom_right = causal_mask(4, 6)[0, 0]
    assert torch.equal(bottom_right, torch.tensor([[j <= i + 2 for j in range(6)] for i in range(4)]))
    assert top_left[0].sum() == 1 and bottom_right[0].sum() == 3
    different = F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right)
    assert (different - F.scaled_dot_product_attention(q, k, v, attn_mask=top_left)).abs().max() > 1e-2


# --- the decoder layer ---


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("sizes", [(3, 6, 9, 12, 3, 20), (2, 5, 4, 16, 4, 8), (1, 7, 11, 8, 1, 32)], ids=str)
def test_decoder_layer_equals_torch_transformer_decoder_layer(sizes, norm_first):
    batch, tgt_len, src_len, d_model, n_heads, d_ff = sizes
    torch_layer, course = torch_and_course_decoder(d_model, n_heads, d_ff, norm_first, seed=sum(sizes))
    target, memory = randn(batch, tgt_len, d_model, seed=17), randn(batch, src_len, d_model, seed=18)
    source_keep = torch.arange(src_len) < torch.tensor([src_len, max(1, src_len - 3), 2])[:batch, None]
    target_keep = torch.arange(tgt_len) < torch.tensor([tgt_len, tgt_len - 2, tgt_len])[:batch, None]
    causal = torch.ones(tgt_len, tgt_len, dtype=torch.bool).tril()  # True = may attend
    with torch.no_grad():
        expected = torch_layer(  # PyTorch's masks: True = blocked
            target,
            memory,
            tgt_mask=~causal,
            tgt_key_padding_mask=~target_keep,
            memory_key_padding_mask=~source_keep,
        )
        self_mask = causal & target_keep[:, None, None, :]  # [batch, 1, tgt_len, tgt_len]
        output = course(target, memory, self_mask=self_mask, memory_mask=source_keep[:, None, None, :])
    torch.testing.assert_close(output, expected, atol=1e-12, rtol=0)


# --- the cache of the source's keys and values ---


class StaleCrossAttention(CrossAttention):
    """The naive cache: the keys and values of the first source it sees, reused for every later source."""

    stale_kv = None

    def source_kv(self, source):
        if self.stale_kv is None:
            self.stale_kv = (
                split_heads(self.w_k(source), self.n_heads),
                split_heads(self.w_v(source), self.n_heads),
            )
        return self.stale_kv


def decode_step_by_step(layers, step_input, memory, memory_mask, use_cache):
    """Run ``layers`` on the growing prefixes of ``step_input`` [batch, steps, d_model], as a decoder does
    while generating: one call per step on all positions so far. Returns the last position's output of each
    step, [batch, steps, d_model]."""
    outputs = []
    for step in range(1, step_input.shape[1] + 1):
        x = step_input[:, :step]
        causal = torch.ones(step, step, dtype=torch.bool).tril()
        for layer in layers:
            if isinstance(layer, nn.TransformerDecoderLayer):
                x = layer(x, memory, tgt_mask=~causal, memory_key_padding_mask=~memory_mask)
            else:
                x = layer(x, memory, causal, memory_mask[:, None, None, :], use_cache=use_cache)
        outputs.append(x[:, -1])
    return torch.stack(outputs, dim=1)  # [batch, steps, d_model]


def test_cache_equals_no_cache_and_torch_over_a_step_by_step_decode():
    batch, steps, src_len, d_model, n_heads, d_ff = 2, 6, 7, 12, 3, 20
    pairs = [torch_and_course_decoder(d_model, n_heads, d_ff, False, seed=20 + i) for i in range(2)]
    torch_layers, course_layers = [p[0] for p in pairs], [p[1] for p in pairs]
    step_input, memory = randn(batch, steps, d_model, seed=22), randn(batch, src_len, d_model, seed=23)
    keep = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])

    calls = {"k": 0}
    hooks = [
        layer.cross_attn.w_k.register_forward_hook(lambda *_: calls.update(k=calls["k"] + 1))
        for layer in course_layers
    ]
    with torch.no_grad():
        expected = decode_step_by_step(torch_layers, step_input, memory, keep, use_cache=False)
        calls["k"] = 0
        without = decode_step_by_step(course_layers, step_input, memory, keep, use_cache=False)
        calls_without = calls["k"]
        calls["k"] = 0
        with_cache = decode_step_by_step(course_layers, step_input, memory, keep, use_cache=True)
        calls_with = calls["k"]
    for hook in hooks:
        hook.remove()
    torch.testing.assert_close(without, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(with_cache, expected, atol=1e-12, rtol=0)
    assert calls_without == len(course_layers) * steps and calls_with == len(course_layers)  # 2 L T -> 2 L


def test_cache_is_recomputed_for_a_new_source_and_the_stale_cache_is_wrong():
    batch, steps, src_len, d_model, n_heads, d_ff = 2, 4, 7, 12, 3, 20
    torch_layer, course = torch_and_course_decoder(d_model, n_heads, d_ff, False, seed=24)
    stale = DecoderLayer(d_model, n_heads, d_ff).double().eval()
    stale.load_state_dict(course.state_dict())
    stale.cross_attn = StaleCrossAttention(d_model, n_heads).double().eval()
    stale.cross_attn.load_state_dict(course.cross_attn.state_dict())

    step_input = randn(batch, steps, d_model, seed=25)
    keep = torch.ones(batch, src_len, dtype=torch.bool)
    with torch.no_grad():
        for index, seed in enumerate((26, 27)):  # two source sentences, one after the other, same shape
            memory = randn(batch, src_len, d_model, seed=seed)
            expected = decode_step_by_step([torch_layer], step_input, memory, keep, use_cache=False)
            cached = decode_step_by_step([course], step_input, memory, keep, use_cache=True)
            naive = decode_step_by_step([stale], step_input, memory, keep, use_cache=True)
            torch.testing.assert_close(cached, expected, atol=1e-12, rtol=0)  # recomputed for the new source
            if index == 0:
                torch.testing.assert_close(naive, expected, atol=1e-12, rtol=0)  # right the first time
            else:
                assert (naive - expected).abs().max() > 1e-2  # the second sentence attends to the first
        # a source modified in place is projected again (its version counter changed)
        memory.mul_(2.0)
        expected = decode_step_by_step([torch_layer], step_input, memory, keep, use_cache=False)
        cached = decode_step_by_step([course], step_input, memory, keep, use_cache=True)
        torch.testing.assert_close(cached, expected, atol=1e-12, rtol=0)


# --- ALBEF: self-attention, then cross-attention, then the feed-forward network (post-LN) ---


def test_a_bert_layer_with_cross_attention_is_a_post_ln_decoder_layer_without_causal_mask():
    """Hugging Face's BertLayer (is_decoder, add_cross_attention), from which ALBEF's xbert.py was adapted,
    runs self-attention, cross-attention, then the feed-forward network, each post-LN; with ReLU and eps 1e-5
    it is the course's DecoderLayer(norm_first=False) with no self-attention mask. Cross-attention first
    computes something else."""
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    d_model, n_heads, d_ff = 24, 3, 40
    config = BertConfig(
        hidden_size=d_model,
        num_attention_heads=n_heads,
        intermediate_size=d_ff,
        hidden_act="relu",
        layer_norm_eps=1e-5,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        is_decoder=True,
        add_cross_attention=True,
    )
    config._attn_implementation = "eager"
    bert = randomized(BertLayer(config, layer_idx=0), seed=28)
    course = DecoderLayer(d_model, n_heads, d_ff).double().eval()
    with torch.no_grad():
        for mine, theirs in ((course.self_attn, bert.attention), (course.cross_attn, bert.crossattention)):
            for linear, hf in zip(
                (mine.w_q, mine.w_k, mine.w_v, mine.w_o),
                (theirs.self.query, theirs.self.key, theirs.self.value, theirs.output.dense),
                strict=True,
            ):
                linear.load_state_dict(hf.state_dict())
        course.norm1.load_state_dict(bert.attention.output.LayerNorm.state_dict())
        course.norm2.load_state_dict(bert.crossattention.output.LayerNorm.state_dict())
        course.linear1.load_state_dict(bert.intermediate.dense.state_dict())
        course.linear2.load_state_dict(bert.output.dense.state_dict())
        course.norm3.load_state_dict(bert.output.LayerNorm.state_dict())

        text, image = randn(2, 5, d_model, seed=29), randn(2, 7, d_model, seed=30)
        keep = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])  # image patches: the second has padding
        additive = torch.zeros(2, 1, 1, 7, dtype=torch.float64).masked_fill(
            ~keep[:, None, None, :], -torch.inf
        )
        expected = bert(text, None, encoder_hidden_states=image, encoder_attention_mask=additive)
        expected = expected[0] if isinstance(expected, tuple) else expected
        output = course(text, image, self_mask=None, memory_mask=keep[:, None, None, :])
        torch.testing.assert_close(output, expected, atol=1e-12, rtol=0)

        # the order some write-ups give (cross-attention first, then self-attention) computes something else
        crossed = course.norm1(text + course.cross_attn(text, image, keep[:, None, None, :])[0])
        selfed = course.norm2(crossed + course.self_attn(crossed, crossed, crossed)[0])
        reversed_order = course.norm3(selfed + course.linear2(F.relu(course.linear1(selfed))))
        assert (reversed_order - expected).abs().max() > 1e-2


# --- near-uniform weights are not vanishing gradients ---


def test_uniform_weights_over_a_long_source_keep_the_query_gradient():
    """With the queries at 0 every weight is exactly 1/n, yet the gradient with respect to the query
    projection does not shrink as n grows (PyTorch's nn.MultiheadAttention, float64)."""
    d_model, n_heads = 16, 4
    norms = {}
    for n in (1_000, 10_000, 100_000):
        mha = randomized(nn.MultiheadAttention(d_model, n_heads, batch_first=True), seed=31)
        with torch.no_grad():
            mha.in_proj_weight[:d_model].zero_()  # W_q = 0
            mha.in_proj_bias[:d_model].zero_()  # b_q = 0: every score is 0
        queries, source = randn(1, 3, d_model, seed=32), randn(1, n, d_model, seed=33)
        output, weights = mha(queries, source, source, average_attn_weights=False)
        torch.testing.assert_close(weights, torch.full_like(weights, 1 / n), atol=1e-15, rtol=0)
        (output @ randn(d_model, seed=34)).sum().backward()
        norms[n] = mha.in_proj_weight.grad[:d_model].norm().item()
    assert min(norms.values()) > 0.1
    assert abs(norms[100_000] / norms[1_000] - 1) < 0.2, norms


# --- a small model learns the alignment ---


def test_a_small_encoder_decoder_learns_to_align_reversal():
    """A one-layer encoder-decoder trained for 100 steps on reversal of 5 letters: the argmax of the
    cross-attention weights (mean over heads) on fresh random sources hits source position 4 - i."""
    from attention_course.transformer import TransformerBlock

    length, vocab, d_model, n_heads = 5, 12, 32, 2  # token 1 is BOS, tokens 2 to 11 are the letters
    torch.manual_seed(0)
    embed_source, embed_target = nn.Embedding(vocab, d_model), nn.Embedding(vocab, d_model)
    position_source, position_target = nn.Embedding(length, d_model), nn.Embedding(length, d_model)
    encoder, decoder = TransformerBlock(d_model, n_heads, 64), DecoderLayer(d_model, n_heads, 64)
    to_vocab = nn.Linear(d_model, vocab)
    modules = nn.ModuleList(
        [embed_source, embed_target, position_source, position_target, encoder, decoder, to_vocab]
    )
    causal = causal_mask(length)
    recorded = {}
    decoder.cross_attn.register_forward_hook(
        lambda module, inputs, output: recorded.update(weights=output[1])
    )

    def logits(source):
        memory = encoder(embed_source(source) + position_source.weight)
        target = source.flip(1)
        target_in = torch.cat([torch.ones_like(target[:, :1]), target[:, :-1]], dim=1)  # 1 = BOS
        return to_vocab(decoder(embed_target(target_in) + position_target.weight, memory, causal)), target

    optimizer = torch.optim.Adam(modules.parameters(), lr=3e-3)
    generator = seeded_generator(35)
    for _ in range(100):
        source = torch.randint(2, vocab, (64, length), generator=generator)
        prediction, target = logits(source)
        loss = F.cross_entropy(prediction.flatten(0, 1), target.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    modules.eval()
    with torch.no_grad():
        prediction, target = logits(torch.randint(2, vocab, (300, length), generator=seeded_generator(36)))
    hits = recorded["weights"].mean(dim=1).argmax(dim=-1) == (length - 1 - torch.arange(length))
    assert (prediction.argmax(-1) == target).float().mean() > 0.95
    assert hits.float().mean() > 0.9
