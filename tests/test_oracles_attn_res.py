"""Block Attention Residuals (norm=attn_res) against the official pseudocode, transcribed: the MoonshotAI/
Attention-Residuals README's "PyTorch-style pseudocode" (`block_attn_res` and the layer's `forward`), read from
a fork that carries the official README, hundong2/Attention-Residuals at 995b625 (the official repository is not
reachable here). The pseudocode is a formula around sublayers: the project's attention, FFN, norms, pseudo-queries
(`proj.weight`) and key norms stand in for theirs. Read with layers counted from 0, the sources starting empty
and the running sum at the embedding; the stack's output (not in the pseudocode) is one more `block_attn_res`
with the exit's query, then the final norm. Final hidden states and every gradient in fp64 and fp32, with every
query, gain and bias moved off its init; negative controls: one query 1% off, and layers counted from 1 (each
block boundary one layer late)."""

import copy

import pytest
import torch

import deepnorm_exp
from deepnorm_exp.schemes.attn_res import BlockAttentionResidual, block_layers
from test_oracles_zoo import TOLERANCES, WIDE, _agree, _hidden_and_grads, _tokens


def official_block_attn_res(blocks, partial_block, proj_weight, norm):
    """`block_attn_res`: attend over the completed blocks and the partial sum, one learned query."""
    V = torch.stack(blocks + [partial_block])  # [N+1, B, T, D]
    K = norm(V)
    logits = torch.einsum("d, n b t d -> n b t", proj_weight, K)
    return torch.einsum("n b t, n b t d -> b t d", logits.softmax(0), V)


def official_layer(block, layer_number, block_size, blocks, hidden_states):
    """The layer's `forward`: block_size counts sublayers (attention + MLP), two a layer."""
    attn, mlp = block.attn, block.ffn
    partial_block = hidden_states
    h = official_block_attn_res(blocks, partial_block, attn.query, attn.key_norm)
    if layer_number % (block_size // 2) == 0:
        blocks.append(partial_block)
        partial_block = None
    attn_out = attn.sublayer(attn.norm(h))
    partial_block = partial_block + attn_out if partial_block is not None else attn_out
    h = official_block_attn_res(blocks, partial_block, mlp.query, mlp.key_norm)
    mlp_out = mlp.sublayer(mlp.norm(h))
    partial_block = partial_block + mlp_out
    return blocks, partial_block


def official_stack(embedding, layers, exit_, block_size, query_scale=1.0, first_layer=0):
    blocks, partial_block = [], embedding
    for number, block in enumerate(layers, start=first_layer):
        blocks, partial_block = official_layer(block, number, block_size, blocks, partial_block)
    h = official_block_attn_res(blocks, partial_block, exit_.query * query_scale, exit_.key_norm)
    return exit_.norm(h)


@pytest.mark.parametrize("dtype, tol", TOLERANCES)
@pytest.mark.parametrize("depth, blocks", [(4, 8), (7, 3), (12, 8)])
def test_block_attn_res_equals_the_official_pseudocode(depth, blocks, dtype, tol, record_deviation):
    cfg = deepnorm_exp.compose(["norm=attn_res", f"norm.blocks={blocks}", f"depth={depth}", *WIDE])
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(cfg).to(dtype).eval()
    with torch.no_grad():  # queries (0 at init: uniform weights), gains and biases off their init
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, dtype=dtype, generator=torch.Generator().manual_seed(len(name))))
    official = copy.deepcopy(model)
    tokens = _tokens(cfg)
    size = 2 * block_layers(depth, blocks)
    ours = _hidden_and_grads(lambda: model.hidden(tokens), dict(model.named_parameters()))
    theirs = _hidden_and_grads(lambda: official_stack(official.embed(tokens), official.blocks, official.final_norm,
                                                      size), dict(official.named_parameters()))
    _agree(record_deviation, ours, theirs, tol)

    with torch.no_grad():
        embedded = official.embed(tokens)
        for control in (dict(query_scale=1.01), dict(first_layer=1)):
            if control.get("first_layer") and size == 2:
                continue  # every layer its own block: counting from 1 moves no boundary
            shown = official_stack(embedded, official.blocks, official.final_norm, size, **control)
            assert not torch.allclose(ours[0], shown, rtol=tol, atol=tol), control


def test_at_init_every_source_weighs_the_same_and_the_state_holds_the_plain_residual_sum():
    """Queries at 0: a sublayer's input is the mean of its sources; the state's sum is the embedding plus every
    sublayer output so far (what `hidden_state` gives the per-block measures)."""
    cfg = deepnorm_exp.compose(["norm=attn_res", "norm.blocks=2", "depth=5", *WIDE])
    torch.manual_seed(0)
    model = deepnorm_exp.build_model(cfg).eval()
    tokens = _tokens(cfg)
    state = model.stream_in(model.embed(tokens))
    plain = model.embed(tokens)
    with torch.no_grad():
        for block in model.blocks:
            for connection in (block.attn, block.ffn):
                assert isinstance(connection, BlockAttentionResidual)
                partial, done = connection.unpack(state)
                sources = torch.cat([done[..., :connection.live, :], partial.unsqueeze(-2)], dim=-2)
                out = connection.sublayer(connection.norm(sources.mean(-2)))
                state = connection(state)
                plain = plain + out
                torch.testing.assert_close(connection.hidden_state(state), plain)
