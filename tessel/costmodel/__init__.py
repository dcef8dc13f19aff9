"""Analytic cost model: what blocks of paper-scale models cost on a given cluster, without it.

One module per job: `hardware` (devices, links, message times), `formulas` (FLOPs, parameters,
activations and the time of a transformer or Evoformer block on a device set), `partition`
(chains of units cut into stages on device groups, and the placement they become) and `zoo`
(GPT, mT5, FLAVA-like, AlphaFold-like, Swin at paper scale). Everything is re-exported here, so
`from tessel import costmodel as cm; cm.gpt(8)` reads as before.
"""
from .formulas import (
                       BACKWARD_FACTOR,
                       EMBEDDING_GRAD_BYTES,
                       EVOFORMER_PASSES,
    FP16_ADAM_BYTES_PER_PARAM,
                       INFER_BYTES_PER_PARAM,
                       SCORE_PASSES,
                       TRAIN_BYTES_PER_PARAM,
                       BlockCost,
                       Evoformer,
                       Shape,
                       attention_flops,
                       combine,
                       cross_attention_flops,
                       embedding_block,
                       evoformer_block,
                       evoformer_flops,
                       evoformer_memory_bytes,
                       evoformer_params,
                       layer_activation_bytes,
                       layer_flops,
                       layer_params,
                       lm_head_block,
                       lm_head_flops,
                       mlp_flops,
                       no_grad,
                       recompute_flops,
                       recomputed,
                       replace_weights,
                       transformer_block,
)
from .hardware import GIB, HARDWARE, MIB, Hardware, allreduce_seconds, hardware, p2p_seconds
from .partition import (
                       LAYOUTS,
                       Cost,
                       ModelSpec,
                       Part,
                       PlacedModel,
                       Segment,
                       Unit,
                       chain_edges,
                       chain_model,
                       edge_seconds,
                       pipeline_parts,
                       seconds_to_ms,
                       share_devices,
                       split_even,
                       stage_parts,
                       stage_ranges,
                       tp_parts,
                       with_recomputation,
)
from .zoo import (
                       A100,
                       SPECS,
                       alphafold_like,
                       alphafold_spec,
                       flava,
                       flava_spec,
                       gpt,
                       gpt_spec,
                       mt5,
                       mt5_spec,
                       recycle_parts,
                       swin,
                       swin_spec,
)

__all__ = [
    "A100", "BACKWARD_FACTOR", "EMBEDDING_GRAD_BYTES", "EVOFORMER_PASSES", "FP16_ADAM_BYTES_PER_PARAM", "GIB", "HARDWARE",
    "INFER_BYTES_PER_PARAM", "LAYOUTS", "MIB", "SCORE_PASSES", "SPECS", "TRAIN_BYTES_PER_PARAM", "BlockCost",
    "Cost", "Evoformer", "Hardware", "ModelSpec", "Part", "PlacedModel", "Segment", "Shape", "Unit",
    "allreduce_seconds", "alphafold_like", "alphafold_spec", "attention_flops", "chain_edges", "chain_model",
    "combine", "cross_attention_flops", "edge_seconds", "embedding_block", "evoformer_block",
    "evoformer_flops", "evoformer_memory_bytes", "evoformer_params", "flava", "flava_spec", "gpt", "gpt_spec",
    "hardware", "layer_activation_bytes", "layer_flops", "layer_params", "lm_head_block", "lm_head_flops",
    "mlp_flops", "mt5", "mt5_spec", "no_grad", "p2p_seconds", "pipeline_parts", "recompute_flops",
    "recomputed", "recycle_parts", "replace_weights", "seconds_to_ms", "share_devices", "split_even",
    "stage_parts", "stage_ranges", "swin", "swin_spec", "tp_parts", "transformer_block", "with_recomputation",
]
