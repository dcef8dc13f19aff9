"""Cost model: formulas against hand-computed values, tensor-parallel scaling, paper-scale models."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tessel import costmodel as cm
from tessel.costmodel import Shape

# b = 2, s = 128, h = 64, a = 4, V = 1000: small enough to multiply by hand
X = Shape(hidden=64, heads=4, seq=128, micro_batch=2, vocab=1000, flash=False)
FREE = replace(cm.A100, intra_bandwidth=float("inf"), nic_bandwidth=float("inf"), link_latency=0.0)


def test_layer_flops_are_24bsh2_plus_4bs2h():
    # 24 * 2 * 128 * 64^2 = 25_165_824 ; 4 * 2 * 128^2 * 64 = 8_388_608
    assert cm.layer_flops(X) == 25_165_824 + 8_388_608
    assert cm.attention_flops(X) == 8 * 2 * 128 * 64 ** 2 + 8_388_608 == 16_777_216
    assert cm.mlp_flops(X) == 16 * 2 * 128 * 64 ** 2 == 16_777_216
    assert cm.lm_head_flops(X) == 2 * 2 * 128 * 64 * 1000 == 32_768_000


def test_gated_mlp_and_cross_attention():
    g = replace(X, ffn=100, gated=True)
    assert cm.mlp_flops(g) == 6 * 256 * 64 * 100 == 9_830_400
    # decoder of 128 tokens attending to 32 encoder tokens:
    # Q, out 4*256*64^2 = 4_194_304 ; K, V 4*2*32*64^2 = 1_048_576 ; scores+sum 4*2*128*32*64 = 2_097_152
    assert cm.cross_attention_flops(X, 32) == 4_194_304 + 1_048_576 + 2_097_152
    assert cm.layer_flops(X, cross_seq=32) == cm.layer_flops(X) + 7_340_032


def test_params_are_12h2_plus_13h():
    assert cm.layer_params(X) == 12 * 64 ** 2 + 13 * 64 == 49_984
    assert cm.layer_params(X, cross=True) == 49_984 + 4 * 64 ** 2 + 6 * 64


def test_activation_memory_follows_korthikanti():
    # t = 1: s b h (34 + 5 a s / h) = 128*2*64 * (34 + 5*4*128/64) = 16384 * 74
    assert cm.layer_activation_bytes(X) == 16384 * 74 == 1_212_416
    # t = 4: s b h (10 + 24/4 + 5 a s / (h t)) = 16384 * (10 + 6 + 10)
    assert cm.layer_activation_bytes(X, t=4) == 16384 * 26
    # a window of 16 keys: 5 a s span b replaces 5 a s^2 b
    assert cm.layer_activation_bytes(X, attn_span=16) == 16384 * 34 + 5 * 4 * 128 * 16 * 2
    # FlashAttention keeps an fp32 log-sum-exp per head and query instead: 4 a s b
    assert cm.layer_activation_bytes(replace(X, flash=True)) == 16384 * 34 + 4 * 4 * 128 * 2


def test_flash_attention_recomputes_scores_in_the_backward():
    plain = cm.transformer_block(X, 1, (0,), FREE)
    flash = cm.transformer_block(replace(X, flash=True), 1, (0,), FREE)
    assert flash.forward == plain.forward
    # Q K^T once more: 2 b s^2 h = 2 * 2 * 128^2 * 64 FLOPs
    assert flash.backward - plain.backward == pytest.approx(2 * 2 * 128 ** 2 * 64 / FREE.flops)
    assert flash.activation < plain.activation


def test_ring_allreduce_and_p2p():
    hw = cm.A100
    nbytes = 1e9
    within = cm.allreduce_seconds(nbytes, (0, 1, 2, 3), hw)
    # 2 (t-1)/t S / 200 GB/s + 2 (t-1) alpha = 1.5e9 / 200e9 + 6e-5
    assert within == pytest.approx(0.0075 + 6e-5)
    assert cm.allreduce_seconds(nbytes, (3,), hw) == 0
    assert cm.p2p_seconds(nbytes, (0,), (1,), hw) == pytest.approx(1e9 / 200e9 + 1e-5)
    assert cm.p2p_seconds(nbytes, (0,), (8,), hw) == pytest.approx(1e9 / 25e9 + 1e-5)  # one NIC
    assert cm.p2p_seconds(nbytes, (0, 1), (1, 0), hw) == 0


def test_cross_node_allreduce_spreads_its_rings_over_the_nics():
    hw = cm.A100  # 8 NICs of 25 GB/s per node
    # devices 4..11: 4 on each of two nodes -> 4 rings -> 4 x 25 = 100 GB/s across the boundary
    across = cm.allreduce_seconds(1e9, tuple(range(4, 12)), hw)
    assert across == pytest.approx(2 * 7 / 8 * 1e9 / 100e9 + 14 * 10e-6)  # 0.0175 + 0.00014
    # 16 devices, 8 per node: all 8 NICs, 200 GB/s = NVLink's rate: no slower than inside a node
    assert hw.ring_bandwidth(tuple(range(16))) == 200e9
    # one device per node: one ring, one NIC
    assert hw.ring_bandwidth((0, 8)) == 25e9
    v100 = cm.hardware("v100-32g")  # one 100 Gb/s card per node
    assert v100.ring_bandwidth(tuple(range(16))) == 12.5e9


def test_scalar_allreduce_takes_the_tree_not_2_t_minus_1_ring_steps():
    hw = cm.A100
    devices = tuple(range(32))
    # 8 KiB over 32 devices: ring 2*31/32*8192/200e9 + 62 alpha = 0.62 ms; tree
    # 2*8192/200e9 + 2*log2(32) alpha = 8.2e-8 + 1e-4
    assert cm.allreduce_seconds(8192, devices, hw) == pytest.approx(2 * 8192 / 200e9 + 10 * 10e-6)
    # the sharded head's three scalar all-reduces (b s fp32 values) cost 0.3 ms, not 1.9 ms
    x = Shape(hidden=8192, heads=64, seq=2048, micro_batch=1, vocab=256_000)
    free_gemm = replace(hw, flops=float("inf"), hbm=float("inf"))
    head = cm.lm_head_block(x, devices, free_gemm)
    assert head.forward == pytest.approx(3 * (2 * 2048 * 4 / 200e9 + 10 * 10e-6))
    # large messages still take the ring: 1 GB over 4 devices as in the test above
    assert cm.allreduce_seconds(1e9, (0, 1, 2, 3), hw) == pytest.approx(0.0075 + 6e-5)


def test_every_edge_pays_its_own_message():
    hw = cm.A100
    cost = cm.BlockCost(forward=0.01, backward=0.02, activation=0, params=0, output=1e9)
    parts = (cm.Part("a", (0,), cost), cm.Part("b", (1,), cost), cm.Part("c", (8,), cost))
    m = cm.PlacedModel("three", 9, parts, (("a", "b"), ("b", "c")), hw)
    p = m.placement()
    intra, inter = 1e9 / 200e9 + 1e-5, 1e9 / 25e9 + 1e-5  # NVLink a->b, one NIC b->c
    assert p.latency == pytest.approx(intra * 1e3)  # the cheapest message, 5.01 ms
    # b sends across nodes: the 35 ms beyond the base go on b's forward, and on c's backward
    # (c sends b the gradient); a and the others pay nothing extra
    assert p.by_id["b.f"].duration == pytest.approx((0.01 + inter - intra) * 1e3)
    assert p.by_id["c.b"].duration == pytest.approx((0.02 + inter - intra) * 1e3)
    assert p.by_id["a.f"].duration == pytest.approx(10) and p.by_id["b.b"].duration == pytest.approx(20)
    # a sharded block's output is on all its devices already: no message into a subset of them
    assert cm.edge_seconds(1e9, (0, 1, 2), (1,), hw) == 0


def test_gated_gelu_keeps_8sbf():
    g = replace(X, ffn=100, gated=True)
    # outside 10 sbh; inside 8 sbh + 8 sbf + 5 a s^2 b (sbh = 16384, sbf = 128*2*100 = 25600)
    assert cm.layer_activation_bytes(g) == 10 * 16384 + 8 * 16384 + 8 * 25600 + 5 * 4 * 128 ** 2 * 2


def test_embedding_backward_includes_its_weight_gradient_pass():
    hw = replace(FREE, hbm=1e9)
    emb = cm.embedding_block(X, (0, 1), hw)
    gather = 2 * X.hidden_bytes / 1e9  # read and write 2 b s h bytes
    # the dense V/t x h gradient: 1000/2 * 64 elements, 12 bytes each (fp16 write, read, fp32 update)
    assert emb.backward == pytest.approx(gather + 12 * 500 * 64 / 1e9)
    assert emb.forward == pytest.approx(gather)


def test_evoformer_is_charged_its_memory_traffic():
    e = cm.Evoformer(msa=4, residues=8, c_m=16, c_z=8, head_dim=4, msa_heads=2, pair_heads=2, opm=4, tri=8)
    # logits: 2*4*64 (row) + 2*8*16 (column) + 2*2*512 (triangle) = 512 + 256 + 2048 = 2816 values
    # elementwise: msa 4*8*16*2 = 1024 bytes, pair 64*8*2 = 1024 bytes
    assert cm.evoformer_memory_bytes(e) == 5 * 2816 * 2 + 10 * (3 * 1024 + 6 * 1024)
    hw = replace(FREE, flops=1e12, hbm=1e9)
    block = cm.evoformer_block(e, 2, (0,), hw)
    assert block.forward == pytest.approx(2 * (cm.evoformer_flops(e) / 1e12 + 120_320 / 1e9))
    assert block.backward == pytest.approx(3 * block.forward)


def test_recomputation_keeps_the_input_and_runs_the_forward_again():
    c = cm.transformer_block(X, 1, (0,), FREE)
    r = cm.recomputed(c)
    assert r.activation == X.hidden_bytes < c.activation
    assert r.backward == pytest.approx(c.backward + c.forward) and r.forward == c.forward
    spec = cm.gpt_spec(4, recompute=True, hidden=512, heads=8, vocab=1000, seq=128)
    assert all(u.cost((0,)).activation == 128 * 512 * 2 for u in spec.segments[0].layers)


def test_tensor_parallel_divides_compute_and_adds_collectives():
    one = cm.transformer_block(X, 3, (0,), FREE)
    four = cm.transformer_block(X, 3, (0, 1, 2, 3), FREE)
    assert four.forward == pytest.approx(one.forward / 4)
    assert four.backward == pytest.approx(one.backward / 4) == pytest.approx(2 * four.forward)
    assert one.forward == pytest.approx(3 * cm.layer_flops(X) / FREE.flops)
    assert four.params == pytest.approx(one.params / 4)
    real4 = cm.transformer_block(X, 3, (0, 1, 2, 3), cm.A100)
    comm = 3 * 2 * cm.allreduce_seconds(X.hidden_bytes, (0, 1, 2, 3), cm.A100)
    assert real4.forward == pytest.approx(four.forward + comm)
    across = cm.transformer_block(X, 3, (6, 7, 8, 9), cm.A100)  # same degree, over two nodes
    assert across.forward > real4.forward


def test_vocabulary_parallel_head_and_embedding_scale_with_t():
    one, four = cm.lm_head_block(X, (0,), FREE), cm.lm_head_block(X, (0, 1, 2, 3), FREE)
    assert one.activation == 4 * 256 * 1000 + X.hidden_bytes  # fp32 probabilities + input
    assert four.activation == 4 * 256 * 1000 / 4 + X.hidden_bytes
    assert four.forward == pytest.approx(one.forward / 4)
    assert one.params == 64 * 1000 and four.params == 64 * 1000 / 4
    emb = cm.embedding_block(X, (0, 1), FREE)
    assert emb.params == 64 * 1000 / 2 + 128 * 64 and emb.weights == "embedding"


def test_even_and_cost_balanced_stages():
    assert cm.split_even(10, 4) == [3, 3, 2, 2]
    cheap = cm.Unit("a", lambda d: cm.BlockCost(1, 2, 0, 0, 0))
    dear = cm.Unit("b", lambda d: cm.BlockCost(4, 8, 0, 0, 0))
    emb = cm.Unit("e", lambda d: cm.BlockCost(0.1, 0.1, 0, 0, 0), layer=False)
    chain = [emb, cheap, cheap, cheap, dear]
    assert [list(r) for r in cm.stage_ranges(chain, 2)] == [[0, 1, 2], [3, 4]]
    assert [list(r) for r in cm.stage_ranges(chain, 2, "cost")] == [[0, 1, 2, 3], [4]]


@pytest.mark.parametrize("devices", [4, 8])
def test_gpt_m_shape_holds_one_copy_of_the_vocabulary(devices):
    m = cm.gpt(devices)
    p = m.placement()
    every = tuple(range(devices))
    assert [b.id for b in p.blocks if b.devices == every] == ["emb.f", "head.f", "head.b", "emb.b"]
    for d in range(devices):
        assert sum(b.memory for b in p.blocks_on(d)) == 0
    emb = 256_000 * 8192
    pipe = cm.gpt(devices, "pipeline")
    # the plain pipeline holds the embedding on the first stage and its tied copy on the last
    assert pipe.static_bytes()[0] - pipe.static_bytes()[1] == pytest.approx(16 * (emb + 2048 * 8192))
    assert m.static_bytes()[0] < pipe.static_bytes()[0]
    assert max(p.loads) < max(pipe.placement().loads)  # the head's work is spread, not on one stage
    assert all(x > 0 for x in m.memory_budget())


def test_layouts_of_every_model_build_valid_placements():
    for build in (cm.gpt, cm.mt5, cm.flava, cm.alphafold_like, cm.swin):
        for layout in cm.LAYOUTS:
            m = build(8, layout)
            p = m.placement()
            assert p.devices == 8 and all(b.duration > 0 for b in p.blocks)
            assert m.replicas == (2 if layout == "chimera" else 1)
    assert not cm.flava(4).placement().is_training
    with pytest.raises(ValueError, match="layout"):
        cm.gpt(4, "ring")


def test_alphafold_recycling_passes_keep_nothing():
    m = cm.alphafold_like(4)
    p = m.placement()
    passes = [b for b in p.blocks if b.id.startswith("p0s")]
    assert passes and all(b.memory == 0 and b.kind == "forward" for b in passes)
    grad = p.by_id["p3s0.f"]
    assert grad.memory > 0 and p.by_id["p3s0.b"].duration == pytest.approx(3 * grad.duration, rel=1e-3)
    # the recycling passes share the stage's weights: counted once per device
    one = cm.evoformer_params(cm.Evoformer()) * 48 / 4 * cm.TRAIN_BYTES_PER_PARAM
    assert m.static_bytes()[0] == pytest.approx(one)


def test_chimera_doubles_the_weights():
    pipe, chim = cm.gpt(4, "pipeline"), cm.gpt(4, "chimera")
    assert chim.static_bytes()[1] == pytest.approx(pipe.static_bytes()[1] + pipe.static_bytes()[2])
