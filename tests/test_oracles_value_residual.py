"""Value residual (norm=value_residual) against the official ResFormer, transcribed: Zcchill/Value-Residual-Learning
at 95652f6, src/modeling/modeling_llama_resformer.py (LlamaModel.forward, LlamaDecoderLayer.forward and
LlamaAttention.forward, eager). The official code is a formula around sublayers: the project's projections,
FFN and norms stand in for q_proj, k_proj, v_proj, o_proj, the MLP and the RMSNorms; the harness has no RoPE
(positions are in its embedding), so none is applied. Final hidden states and every gradient in fp64 and fp32;
negative controls: a share 1% off, and V_1 never carried (each layer its own values: plain Pre-LN)."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import deepnorm_exp
from deepnorm_exp.schemes.value_residual import ValueMix, ValueResidual
from test_oracles_zoo import TOLERANCES, WIDE, _agree, _hidden_and_grads, _tokens


def official_resformer_attention(attention, hidden_states, layer_idx, formal_layer_values, share=0.5):
    """LlamaAttention.forward (lines 359-438) with the eager softmax, computed here in the input's dtype (the
    official code's is in fp32): layer 0 appends its value_states to formal_layer_values, every later layer
    attends to 0.5 of them plus 0.5 of its own."""
    bsz, q_len, _ = hidden_states.size()
    w_q, w_k, w_v = attention.qkv.weight.chunk(3)
    b_q, b_k, b_v = attention.qkv.bias.chunk(3)
    query_states, key_states = F.linear(hidden_states, w_q, b_q), F.linear(hidden_states, w_k, b_k)
    value_states = F.linear(hidden_states, w_v, b_v)
    if layer_idx == 0:
        formal_layer_values.append(value_states)
    else:
        value_states = share * formal_layer_values[0] + (1 - share) * value_states
    num_heads = attention.n_heads
    head_dim = attention.d_model // num_heads
    query_states, key_states, value_states = (t.view(bsz, q_len, num_heads, head_dim).transpose(1, 2)
                                              for t in (query_states, key_states, value_states))
    attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(head_dim)
    causal_mask = torch.full((q_len, q_len), float("-inf"), dtype=attn_weights.dtype).triu(1)
    attn_weights = attn_weights + causal_mask
    attn_weights = F.softmax(attn_weights, dim=-1)  # the official upcasts to fp32: that would bound the fp64 check
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous().reshape(bsz, q_len, -1)
    return attention.out(attn_output)


def official_resformer_stack(hidden_states, layers, final_norm, share=0.5, carried=True):
    """LlamaModel.forward's loop (formal_layer_values = [] before it) over LlamaDecoderLayer.forward (residual,
    input_layernorm, self_attn, residual add; residual, post_attention_layernorm, mlp, residual add), then
    the final norm. `carried=False` (a control): each layer's list starts empty, so none mixes."""
    formal_layer_values = []
    for layer_idx, block in enumerate(layers):
        residual = hidden_states
        hidden_states = block.attn.norm(hidden_states)
        hidden_states = official_resformer_attention(block.attn.sublayer, hidden_states,
                                                     layer_idx if carried else 0,
                                                     formal_layer_values if carried else [], share)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = block.ffn.sublayer(block.ffn.norm(hidden_states))
        hidden_states = residual + hidden_states
    return final_norm(hidden_states)


@pytest.mark.parametrize("dtype, tol", TOLERANCES)
@pytest.mark.parametrize("depth", [2, 12])
def test_value_residual_equals_the_official_resformer(depth, dtype, tol, record_deviation):
    cfg = deepnorm_exp.compose(["norm=value_residual", "norm.layer=rmsnorm", f"depth={depth}", *WIDE])
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(cfg).to(dtype).eval()
    with torch.no_grad():  # gains and biases off their init, so the copies are what is compared
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn(p.shape, dtype=dtype, generator=torch.Generator().manual_seed(len(name))))
    official = copy.deepcopy(model)
    tokens = _tokens(cfg)
    ours = _hidden_and_grads(lambda: model.hidden(tokens), dict(model.named_parameters()))
    theirs = _hidden_and_grads(lambda: official_resformer_stack(official.embed(tokens), official.blocks,
                                                                official.final_norm.norm),
                               dict(official.named_parameters()))
    _agree(record_deviation, ours, theirs, tol)

    with torch.no_grad():
        embedded = official.embed(tokens)
        for control in (dict(share=0.505), dict(carried=False)):
            shown = official_resformer_stack(embedded, official.blocks, official.final_norm.norm, **control)
            assert not torch.allclose(ours[0], shown, rtol=tol, atol=tol), control


def test_each_stacks_first_self_attention_writes_the_values_and_cross_attention_never_mixes():
    """Encoder-decoder: the encoder's and the decoder's layer-0 self-attentions write V_1 (their stacks' own);
    later self-attentions mix; cross-attention and the FFNs carry V_1 past unchanged; no tensor is left on a
    mix after a forward (a checkpointed recompute starts clean)."""
    cfg = deepnorm_exp.compose(["norm=value_residual", "model=encdec", "depth=3", *WIDE])
    model = deepnorm_exp.build_model(cfg).eval()
    for stack in (model.encoder, model.decoder):
        blocks = [m for m in stack.modules() if isinstance(m, ValueResidual)]
        kinds = [(b.sublayer.kind, b.writes_first, b.mix is not None) for b in blocks]
        writers = [k for k in kinds if k[1] and k[0] == "attention"]
        assert len(writers) == 1 and kinds[0] == ("attention", True, True)
        assert all(mixes == (kind == "attention") for kind, _, mixes in kinds)
    batch = {"src": torch.randint(3, 200, (2, 7)), "tgt": torch.randint(3, 200, (2, 9))}
    model.loss(batch)
    assert all(m.first is None and m.seen is None for m in model.modules() if isinstance(m, ValueMix))
