#!/usr/bin/env python3
"""BatchAttentionWithAttentionSinkWrapper.plan(custom_mask=...) ignores the mask

Call: flashinfer.BatchAttentionWithAttentionSinkWrapper(backend='fa2', use_cuda_graph=True, window_left=127,
    custom_mask_buf=..., mask_indptr_buf=...), then plan(causal=False, window_left=127, uniform_q_len=7,
    custom_mask=...), run()
Shape: batch 8; qo_len 7 each; kv_len 71 each; 64 query and 8 KV heads; head_dim 64; page_size 1 (scattered
    pages); window_left 127; causal=True; a draft tree per request (parents in CASE); sinks; no soft-cap;
    bfloat16
What is wrong: BatchAttentionWithAttentionSinkWrapper planned with the tree as custom_mask and window_left=W:
    its AttentionSink variant reads no custom mask, so the tree and causality are dropped
Where it shows: verify b8 p64 q7 tree [6 choices, depth 2] W127 ps1 h64/8 d64 bfloat16 sinks s0 [gpt-oss-20b]
Rows, as the suite models the path: request 0: queries 0-1 see 6 - i keys outside its mask, queries 2-3 see 7
    - i keys outside its mask, queries 4-6 see 4 keys outside its mask
Matters: custom_mask given to the sink wrapper
Expected: every row is float32 softmax attention over the keys its mask allows (reference() below), within
    swabench's gate: rel-L2 at most 0.01 overall and 0.05 in every row and head
Observed on flashinfer 0.7.4, NVIDIA H200 (132 SMs): REPRODUCED: requests 0-7: rows 0-6 wrong (rel-L2 0.247,
    worst row 1.93; tolerances 0.01, 0.05)
Observed on flashinfer 0.7.2.post1, NVIDIA H200 (132 SMs): REPRODUCED: requests 0-7: rows 0-6 wrong (rel-L2
    0.247, worst row 1.93; tolerances 0.01, 0.05)
Fault: FlashInfer: BatchAttentionWithAttentionSinkWrapper.plan() takes custom_mask and its AttentionSink
    variant never reads it.
Control: the correct call, tree-branches-sink (the sink wrapper with one request per node (SGLang's fa3
    recipe, GPT-OSS): its window of the cache and its ancestors as one-token pages); its verdict is printed
    beside the bug's
Made by: swabench repro --bug tree-sink-mask
Run: python3 with torch, flashinfer and a CUDA GPU (kernels build on first use: minutes). It prints REPRODUCED
    or NOT REPRODUCED, the control's verdict, the environment; exits 1 when reproduced.
"""

import sys

import torch

import flashinfer

CASE = dict(
    qo_lens=[7] * 8, kv_lens=[71] * 8, num_qo_heads=64, num_kv_heads=8, head_dim=64, page_size=1,
    window_left=127, causal=True, chunk=0, sm_scale=0.125, dtype='bfloat16', cache_dtype='bfloat16', seed=0,
    parents=[[-1, 0, 0, 1, 1, 2, 2], [-1, 0, 0, 1, 1, 2, 2], [-1, 0, 0, 1, 1, 2, 2], [-1, 0, 0, 1, 1, 2, 2], [-1, 0, 0, 1, 1, 2, 2], [-1, 0, 0, 1, 1, 2, 2], [-1, 0, 0, 1, 1, 2, 2], [-1, 0, 0, 1, 1, 2, 2]])
TOLERANCE = {'rel_l2': 0.01, 'row_rel_l2': 0.05}  # swabench's gate on random inputs, bfloat16
DEVICE = "cuda"


def main():
    dev = torch.device(DEVICE)
    env = environment()  # before any call: a crash can take the CUDA context with it
    x = make_inputs(CASE, dev)
    q, k_cache, v_cache, sinks, qo_indptr = x["q"], x["k_cache"], x["v_cache"], x["sinks"], x["qo_indptr"]
    kv_indptr, kv_indices, kv_last_page_len = x["kv_indptr"], x["kv_indices"], x["kv_last_page_len"]
    out = torch.empty_like(x["q"])
    workspace = torch.empty((268435456,), dtype=torch.uint8, device=dev)
    sink_wrapper = flashinfer.BatchAttentionWithAttentionSinkWrapper(
        workspace, "NHD", backend="fa2", use_cuda_graph=True,
        qo_indptr_buf=torch.empty((9,), dtype=torch.int32, device=dev),
        paged_kv_indptr_buf=torch.empty((9,), dtype=torch.int32, device=dev),
        paged_kv_indices_buf=torch.empty((568,), dtype=torch.int32, device=dev),
        paged_kv_last_page_len_buf=torch.empty((8,), dtype=torch.int32, device=dev),
        custom_mask_buf=torch.empty((504,), dtype=torch.uint8, device=dev),
        mask_indptr_buf=torch.empty((9,), dtype=torch.int32, device=dev), q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16, head_dim_qk=64, head_dim_vo=64, window_left=127)
    m1 = window_mask(CASE, starts=[0] * 8, ends=[71] * 8, device=dev)
    sink_wrapper.plan(
        qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads=64, num_kv_heads=8,
        q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=0.125, custom_mask=m1, causal=False,
        head_dim_qk=64, window_left=127, page_size=1, **taken_by(sink_wrapper.plan, uniform_q_len=7))

    def step():
        sink_wrapper.run(q, (k_cache, v_cache), sinks, 0.125, out=out)

    # Control: the correct call, tree-branches-sink (the sink wrapper with one request per node (SGLang's fa3
    # recipe, GPT-OSS): its window of the cache and its ancestors as one-token pages)
    out_control = torch.empty_like(x["q"])
    workspace_control = torch.empty((268435456,), dtype=torch.uint8, device=dev)
    sink_wrapper_control = flashinfer.BatchAttentionWithAttentionSinkWrapper(
        workspace_control, "NHD", backend="fa2", use_cuda_graph=True,
        qo_indptr_buf=torch.empty((57,), dtype=torch.int32, device=dev),
        paged_kv_indptr_buf=torch.empty((57,), dtype=torch.int32, device=dev),
        paged_kv_indices_buf=torch.empty((3720,), dtype=torch.int32, device=dev),
        paged_kv_last_page_len_buf=torch.empty((56,), dtype=torch.int32, device=dev), q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16, head_dim_qk=64, head_dim_vo=64, window_left=127)
    idx1_control = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56], dtype=torch.int32)
    idx2_control = torch.tensor([0, 65, 131, 197, 264, 331, 398, 465, 530, 596, 662, 729, 796, 863, 930, 995, 1061, 1127, 1194, 1261, 1328, 1395, 1460, 1526, 1592, 1659, 1726, 1793, 1860, 1925, 1991, 2057, 2124, 2191, 2258, 2325, 2390, 2456, 2522, 2589, 2656, 2723, 2790, 2855, 2921, 2987, 3054, 3121, 3188, 3255, 3320, 3386, 3452, 3519, 3586, 3653, 3720], dtype=torch.int32)
    idx3_control = torch.tensor([429, 249, 542, 291, 23, 43, 191, 261, 407, 304, 12, 273, 388, 21, 487, 20, 382, 93, 460, 341, 170, 401, 222, 42, 195, 9, 380, 79, 117, 286, 194, 321, 14, 221, 473, 112, 243, 475, 220, 135, 469, 201, 95, 516, 99, 282, 514, 443, 129, 239, 492, 359, 188, 203, 315, 206, 32, 311, 85, 535, 94, 161, 157, 216, 62, 429, 249, 542, 291, 23, 43, 191, 261, 407, 304, 12, 273, 388, 21, 487, 20, 382, 93, 460, 341, 170, 401, 222, 42, 195, 9, 380, 79, 117, 286, 194, 321, 14, 221, 473, 112, 243, 475, 220, 135, 469, 201, 95, 516, 99, 282, 514, 443, 129, 239, 492, 359, 188, 203, 315, 206, 32, 311, 85, 535, 94, 161, 157, 216, 62, 136, 429, 249, 542, 291, 23, 43, 191, 261, 407, 304, 12, 273, 388, 21, 487, 20, 382, 93, 460, 341, 170, 401, 222, 42, 195, 9, 380, 79, 117, 286, 194, 321, 14, 221, 473, 112, 243, 475, 220, 135, 469, 201, 95, 516, 99, 282, 514, 443, 129, 239, 492, 359, 188, 203, 315, 206, 32, 311, 85, 535, 94, 161, 157, 216, 62, 331, 429, 249, 542, 291, 23, 43, 191, 261, 407, 304, 12, 273, 388, 21, 487, 20, 382, 93, 460, 341, 170, 401, 222, 42, 195, 9, 380, 79, 117, 286, 194, 321, 14, 221, 473, 112, 243, 475, 220, 135, 469, 201, 95, 516, 99, 282, 514, 443, 129, 239, 492, 359, 188, 203, 315, 206, 32, 311, 85, 535, 94, 161, 157, 216, 62, 136, 132, 429, 249, 542, 291, 23, 43, 191, 261, 407, 304, 12, 273, 388, 21, 487, 20, 382, 93, 460, 341, 170, 401, 222, 42, 195, 9, 380, 79, 117, 286, 194, 321, 14, 221, 473, 112, 243, 475, 220, 135, 469, 201, 95, 516, 99, 282, 514, 443, 129, 239, 492, 359, 188, 203, 315, 206, 32, 311, 85, 535, 94, 161, 157, 216, 62, 136, 140, 429, 249, 542, 291, 23, 43, 191, 261, 407, 304, 12, 273, 388, 21, 487, 20, 382, 93, 460, 341, 170, 401, 222, 42, 195, 9, 380, 79, 117, 286, 194, 321, 14, 221, 473, 112, 243, 475, 220, 135, 469, 201, 95, 516, 99, 282, 514, 443, 129, 239, 492, 359, 188, 203, 315, 206, 32, 311, 85, 535, 94, 161, 157, 216, 62, 331, 302, 429, 249, 542, 291, 23, 43, 191, 261, 407, 304, 12, 273, 388, 21, 487, 20, 382, 93, 460, 341, 170, 401, 222, 42, 195, 9, 380, 79, 117, 286, 194, 321, 14, 221, 473, 112, 243, 475, 220, 135, 469, 201, 95, 516, 99, 282, 514, 443, 129, 239, 492, 359, 188, 203, 315, 206, 32, 311, 85, 535, 94, 161, 157, 216, 62, 331, 185, 8, 308, 540, 288, 402, 333, 417, 307, 476, 39, 326, 144, 453, 455, 208, 351, 434, 87, 559, 552, 4, 125, 92, 457, 225, 447, 522, 450, 108, 105, 149, 439, 314, 74, 448, 81, 27, 235, 485, 423, 529, 561, 96, 57, 324, 98, 300, 546, 456, 58, 305, 279, 210, 393, 45, 511, 159, 200, 292, 111, 310, 344, 56, 202, 501, 8, 308, 540, 288, 402, 333, 417, 307, 476, 39, 326, 144, 453, 455, 208, 351, 434, 87, 559, 552, 4, 125, 92, 457, 225, 447, 522, 450, 108, 105, 149, 439, 314, 74, 448, 81, 27, 235, 485, 423, 529, 561, 96, 57, 324, 98, 300, 546, 456, 58, 305, 279, 210, 393, 45, 511, 159, 200, 292, 111, 310, 344, 56, 202, 501, 148, 8, 308, 540, 288, 402, 333, 417, 307, 476, 39, 326, 144, 453, 455, 208, 351, 434, 87, 559, 552, 4, 125, 92, 457, 225, 447, 522, 450, 108, 105, 149, 439, 314, 74, 448, 81, 27, 235, 485, 423, 529, 561, 96, 57, 324, 98, 300, 546, 456, 58, 305, 279, 210, 393, 45, 511, 159, 200, 292, 111, 310, 344, 56, 202, 501, 123, 8, 308, 540, 288, 402, 333, 417, 307, 476, 39, 326, 144, 453, 455, 208, 351, 434, 87, 559, 552, 4, 125, 92, 457, 225, 447, 522, 450, 108, 105, 149, 439, 314, 74, 448, 81, 27, 235, 485, 423, 529, 561, 96, 57, 324, 98, 300, 546, 456, 58, 305, 279, 210, 393, 45, 511, 159, 200, 292, 111, 310, 344, 56, 202, 501, 148, 297, 8, 308, 540, 288, 402, 333, 417, 307, 476, 39, 326, 144, 453, 455, 208, 351, 434, 87, 559, 552, 4, 125, 92, 457, 225, 447, 522, 450, 108, 105, 149, 439, 314, 74, 448, 81, 27, 235, 485, 423, 529, 561, 96, 57, 324, 98, 300, 546, 456, 58, 305, 279, 210, 393, 45, 511, 159, 200, 292, 111, 310, 344, 56, 202, 501, 148, 238, 8, 308, 540, 288, 402, 333, 417, 307, 476, 39, 326, 144, 453, 455, 208, 351, 434, 87, 559, 552, 4, 125, 92, 457, 225, 447, 522, 450, 108, 105, 149, 439, 314, 74, 448, 81, 27, 235, 485, 423, 529, 561, 96, 57, 324, 98, 300, 546, 456, 58, 305, 279, 210, 393, 45, 511, 159, 200, 292, 111, 310, 344, 56, 202, 501, 123, 303, 8, 308, 540, 288, 402, 333, 417, 307, 476, 39, 326, 144, 453, 455, 208, 351, 434, 87, 559, 552, 4, 125, 92, 457, 225, 447, 522, 450, 108, 105, 149, 439, 314, 74, 448, 81, 27, 235, 485, 423, 529, 561, 96, 57, 324, 98, 300, 546, 456, 58, 305, 279, 210, 393, 45, 511, 159, 200, 292, 111, 310, 344, 56, 202, 501, 123, 384, 104, 378, 228, 207, 166, 353, 184, 296, 227, 510, 252, 51, 284, 154, 294, 175, 441, 391, 479, 230, 78, 65, 377, 29, 262, 472, 444, 60, 254, 565, 330, 525, 35, 160, 346, 366, 11, 204, 528, 348, 349, 442, 30, 131, 298, 2, 494, 369, 504, 317, 114, 339, 394, 563, 102, 343, 66, 186, 396, 482, 340, 67, 329, 171, 253, 104, 378, 228, 207, 166, 353, 184, 296, 227, 510, 252, 51, 284, 154, 294, 175, 441, 391, 479, 230, 78, 65, 377, 29, 262, 472, 444, 60, 254, 565, 330, 525, 35, 160, 346, 366, 11, 204, 528, 348, 349, 442, 30, 131, 298, 2, 494, 369, 504, 317, 114, 339, 394, 563, 102, 343, 66, 186, 396, 482, 340, 67, 329, 171, 253, 424, 104, 378, 228, 207, 166, 353, 184, 296, 227, 510, 252, 51, 284, 154, 294, 175, 441, 391, 479, 230, 78, 65, 377, 29, 262, 472, 444, 60, 254, 565, 330, 525, 35, 160, 346, 366, 11, 204, 528, 348, 349, 442, 30, 131, 298, 2, 494, 369, 504, 317, 114, 339, 394, 563, 102, 343, 66, 186, 396, 482, 340, 67, 329, 171, 253, 385, 104, 378, 228, 207, 166, 353, 184, 296, 227, 510, 252, 51, 284, 154, 294, 175, 441, 391, 479, 230, 78, 65, 377, 29, 262, 472, 444, 60, 254, 565, 330, 525, 35, 160, 346, 366, 11, 204, 528, 348, 349, 442, 30, 131, 298, 2, 494, 369, 504, 317, 114, 339, 394, 563, 102, 343, 66, 186, 396, 482, 340, 67, 329, 171, 253, 424, 567, 104, 378, 228, 207, 166, 353, 184, 296, 227, 510, 252, 51, 284, 154, 294, 175, 441, 391, 479, 230, 78, 65, 377, 29, 262, 472, 444, 60, 254, 565, 330, 525, 35, 160, 346, 366, 11, 204, 528, 348, 349, 442, 30, 131, 298, 2, 494, 369, 504, 317, 114, 339, 394, 563, 102, 343, 66, 186, 396, 482, 340, 67, 329, 171, 253, 424, 48, 104, 378, 228, 207, 166, 353, 184, 296, 227, 510, 252, 51, 284, 154, 294, 175, 441, 391, 479, 230, 78, 65, 377, 29, 262, 472, 444, 60, 254, 565, 330, 525, 35, 160, 346, 366, 11, 204, 528, 348, 349, 442, 30, 131, 298, 2, 494, 369, 504, 317, 114, 339, 394, 563, 102, 343, 66, 186, 396, 482, 340, 67, 329, 171, 253, 385, 519, 104, 378, 228, 207, 166, 353, 184, 296, 227, 510, 252, 51, 284, 154, 294, 175, 441, 391, 479, 230, 78, 65, 377, 29, 262, 472, 444, 60, 254, 565, 330, 525, 35, 160, 346, 366, 11, 204, 528, 348, 349, 442, 30, 131, 298, 2, 494, 369, 504, 317, 114, 339, 394, 563, 102, 343, 66, 186, 396, 482, 340, 67, 329, 171, 253, 385, 145, 229, 499, 7, 130, 280, 549, 454, 381, 397, 405, 379, 390, 547, 226, 526, 275, 285, 533, 404, 419, 276, 556, 172, 169, 451, 267, 265, 83, 18, 277, 256, 521, 425, 240, 365, 489, 151, 244, 373, 217, 537, 403, 420, 272, 68, 386, 31, 471, 506, 88, 209, 566, 532, 178, 462, 515, 539, 503, 15, 337, 37, 374, 478, 100, 103, 229, 499, 7, 130, 280, 549, 454, 381, 397, 405, 379, 390, 547, 226, 526, 275, 285, 533, 404, 419, 276, 556, 172, 169, 451, 267, 265, 83, 18, 277, 256, 521, 425, 240, 365, 489, 151, 244, 373, 217, 537, 403, 420, 272, 68, 386, 31, 471, 506, 88, 209, 566, 532, 178, 462, 515, 539, 503, 15, 337, 37, 374, 478, 100, 103, 150, 229, 499, 7, 130, 280, 549, 454, 381, 397, 405, 379, 390, 547, 226, 526, 275, 285, 533, 404, 419, 276, 556, 172, 169, 451, 267, 265, 83, 18, 277, 256, 521, 425, 240, 365, 489, 151, 244, 373, 217, 537, 403, 420, 272, 68, 386, 31, 471, 506, 88, 209, 566, 532, 178, 462, 515, 539, 503, 15, 337, 37, 374, 478, 100, 103, 364, 229, 499, 7, 130, 280, 549, 454, 381, 397, 405, 379, 390, 547, 226, 526, 275, 285, 533, 404, 419, 276, 556, 172, 169, 451, 267, 265, 83, 18, 277, 256, 521, 425, 240, 365, 489, 151, 244, 373, 217, 537, 403, 420, 272, 68, 386, 31, 471, 506, 88, 209, 566, 532, 178, 462, 515, 539, 503, 15, 337, 37, 374, 478, 100, 103, 150, 468, 229, 499, 7, 130, 280, 549, 454, 381, 397, 405, 379, 390, 547, 226, 526, 275, 285, 533, 404, 419, 276, 556, 172, 169, 451, 267, 265, 83, 18, 277, 256, 521, 425, 240, 365, 489, 151, 244, 373, 217, 537, 403, 420, 272, 68, 386, 31, 471, 506, 88, 209, 566, 532, 178, 462, 515, 539, 503, 15, 337, 37, 374, 478, 100, 103, 150, 313, 229, 499, 7, 130, 280, 549, 454, 381, 397, 405, 379, 390, 547, 226, 526, 275, 285, 533, 404, 419, 276, 556, 172, 169, 451, 267, 265, 83, 18, 277, 256, 521, 425, 240, 365, 489, 151, 244, 373, 217, 537, 403, 420, 272, 68, 386, 31, 471, 506, 88, 209, 566, 532, 178, 462, 515, 539, 503, 15, 337, 37, 374, 478, 100, 103, 364, 392, 229, 499, 7, 130, 280, 549, 454, 381, 397, 405, 379, 390, 547, 226, 526, 275, 285, 533, 404, 419, 276, 556, 172, 169, 451, 267, 265, 83, 18, 277, 256, 521, 425, 240, 365, 489, 151, 244, 373, 217, 537, 403, 420, 272, 68, 386, 31, 471, 506, 88, 209, 566, 532, 178, 462, 515, 539, 503, 15, 337, 37, 374, 478, 100, 103, 364, 142, 496, 106, 548, 446, 493, 147, 538, 189, 400, 176, 258, 414, 497, 500, 241, 143, 480, 16, 318, 470, 152, 436, 334, 242, 438, 6, 36, 231, 466, 461, 368, 28, 335, 474, 263, 347, 121, 278, 255, 508, 165, 322, 357, 187, 137, 362, 40, 192, 264, 250, 174, 168, 69, 219, 0, 316, 428, 477, 412, 361, 432, 77, 370, 213, 115, 496, 106, 548, 446, 493, 147, 538, 189, 400, 176, 258, 414, 497, 500, 241, 143, 480, 16, 318, 470, 152, 436, 334, 242, 438, 6, 36, 231, 466, 461, 368, 28, 335, 474, 263, 347, 121, 278, 255, 508, 165, 322, 357, 187, 137, 362, 40, 192, 264, 250, 174, 168, 69, 219, 0, 316, 428, 477, 412, 361, 432, 77, 370, 213, 115, 183, 496, 106, 548, 446, 493, 147, 538, 189, 400, 176, 258, 414, 497, 500, 241, 143, 480, 16, 318, 470, 152, 436, 334, 242, 438, 6, 36, 231, 466, 461, 368, 28, 335, 474, 263, 347, 121, 278, 255, 508, 165, 322, 357, 187, 137, 362, 40, 192, 264, 250, 174, 168, 69, 219, 0, 316, 428, 477, 412, 361, 432, 77, 370, 213, 115, 179, 496, 106, 548, 446, 493, 147, 538, 189, 400, 176, 258, 414, 497, 500, 241, 143, 480, 16, 318, 470, 152, 436, 334, 242, 438, 6, 36, 231, 466, 461, 368, 28, 335, 474, 263, 347, 121, 278, 255, 508, 165, 322, 357, 187, 137, 362, 40, 192, 264, 250, 174, 168, 69, 219, 0, 316, 428, 477, 412, 361, 432, 77, 370, 213, 115, 183, 289, 496, 106, 548, 446, 493, 147, 538, 189, 400, 176, 258, 414, 497, 500, 241, 143, 480, 16, 318, 470, 152, 436, 334, 242, 438, 6, 36, 231, 466, 461, 368, 28, 335, 474, 263, 347, 121, 278, 255, 508, 165, 322, 357, 187, 137, 362, 40, 192, 264, 250, 174, 168, 69, 219, 0, 316, 428, 477, 412, 361, 432, 77, 370, 213, 115, 183, 358, 496, 106, 548, 446, 493, 147, 538, 189, 400, 176, 258, 414, 497, 500, 241, 143, 480, 16, 318, 470, 152, 436, 334, 242, 438, 6, 36, 231, 466, 461, 368, 28, 335, 474, 263, 347, 121, 278, 255, 508, 165, 322, 357, 187, 137, 362, 40, 192, 264, 250, 174, 168, 69, 219, 0, 316, 428, 477, 412, 361, 432, 77, 370, 213, 115, 179, 410, 496, 106, 548, 446, 493, 147, 538, 189, 400, 176, 258, 414, 497, 500, 241, 143, 480, 16, 318, 470, 152, 436, 334, 242, 438, 6, 36, 231, 466, 461, 368, 28, 335, 474, 263, 347, 121, 278, 255, 508, 165, 322, 357, 187, 137, 362, 40, 192, 264, 250, 174, 168, 69, 219, 0, 316, 428, 477, 412, 361, 432, 77, 370, 213, 115, 179, 527, 71, 553, 155, 116, 177, 3, 26, 211, 427, 63, 557, 558, 509, 418, 507, 156, 138, 458, 246, 5, 76, 17, 113, 435, 197, 128, 281, 409, 89, 523, 495, 421, 323, 411, 312, 97, 25, 47, 534, 162, 259, 332, 463, 126, 406, 564, 562, 449, 90, 80, 465, 50, 301, 13, 173, 199, 327, 375, 440, 268, 233, 467, 398, 82, 107, 71, 553, 155, 116, 177, 3, 26, 211, 427, 63, 557, 558, 509, 418, 507, 156, 138, 458, 246, 5, 76, 17, 113, 435, 197, 128, 281, 409, 89, 523, 495, 421, 323, 411, 312, 97, 25, 47, 534, 162, 259, 332, 463, 126, 406, 564, 562, 449, 90, 80, 465, 50, 301, 13, 173, 199, 327, 375, 440, 268, 233, 467, 398, 82, 107, 536, 71, 553, 155, 116, 177, 3, 26, 211, 427, 63, 557, 558, 509, 418, 507, 156, 138, 458, 246, 5, 76, 17, 113, 435, 197, 128, 281, 409, 89, 523, 495, 421, 323, 411, 312, 97, 25, 47, 534, 162, 259, 332, 463, 126, 406, 564, 562, 449, 90, 80, 465, 50, 301, 13, 173, 199, 327, 375, 440, 268, 233, 467, 398, 82, 107, 345, 71, 553, 155, 116, 177, 3, 26, 211, 427, 63, 557, 558, 509, 418, 507, 156, 138, 458, 246, 5, 76, 17, 113, 435, 197, 128, 281, 409, 89, 523, 495, 421, 323, 411, 312, 97, 25, 47, 534, 162, 259, 332, 463, 126, 406, 564, 562, 449, 90, 80, 465, 50, 301, 13, 173, 199, 327, 375, 440, 268, 233, 467, 398, 82, 107, 536, 180, 71, 553, 155, 116, 177, 3, 26, 211, 427, 63, 557, 558, 509, 418, 507, 156, 138, 458, 246, 5, 76, 17, 113, 435, 197, 128, 281, 409, 89, 523, 495, 421, 323, 411, 312, 97, 25, 47, 534, 162, 259, 332, 463, 126, 406, 564, 562, 449, 90, 80, 465, 50, 301, 13, 173, 199, 327, 375, 440, 268, 233, 467, 398, 82, 107, 536, 124, 71, 553, 155, 116, 177, 3, 26, 211, 427, 63, 557, 558, 509, 418, 507, 156, 138, 458, 246, 5, 76, 17, 113, 435, 197, 128, 281, 409, 89, 523, 495, 421, 323, 411, 312, 97, 25, 47, 534, 162, 259, 332, 463, 126, 406, 564, 562, 449, 90, 80, 465, 50, 301, 13, 173, 199, 327, 375, 440, 268, 233, 467, 398, 82, 107, 345, 543, 71, 553, 155, 116, 177, 3, 26, 211, 427, 63, 557, 558, 509, 418, 507, 156, 138, 458, 246, 5, 76, 17, 113, 435, 197, 128, 281, 409, 89, 523, 495, 421, 323, 411, 312, 97, 25, 47, 534, 162, 259, 332, 463, 126, 406, 564, 562, 449, 90, 80, 465, 50, 301, 13, 173, 199, 327, 375, 440, 268, 233, 467, 398, 82, 107, 345, 122, 437, 430, 24, 545, 352, 395, 416, 355, 33, 551, 408, 306, 22, 245, 319, 290, 134, 141, 338, 486, 101, 550, 215, 236, 274, 350, 431, 328, 363, 413, 271, 269, 163, 283, 295, 120, 560, 248, 52, 181, 266, 354, 513, 46, 270, 376, 383, 531, 139, 387, 488, 237, 372, 325, 218, 109, 196, 119, 234, 260, 84, 61, 73, 415, 498, 437, 430, 24, 545, 352, 395, 416, 355, 33, 551, 408, 306, 22, 245, 319, 290, 134, 141, 338, 486, 101, 550, 215, 236, 274, 350, 431, 328, 363, 413, 271, 269, 163, 283, 295, 120, 560, 248, 52, 181, 266, 354, 513, 46, 270, 376, 383, 531, 139, 387, 488, 237, 372, 325, 218, 109, 196, 119, 234, 260, 84, 61, 73, 415, 498, 41, 437, 430, 24, 545, 352, 395, 416, 355, 33, 551, 408, 306, 22, 245, 319, 290, 134, 141, 338, 486, 101, 550, 215, 236, 274, 350, 431, 328, 363, 413, 271, 269, 163, 283, 295, 120, 560, 248, 52, 181, 266, 354, 513, 46, 270, 376, 383, 531, 139, 387, 488, 237, 372, 325, 218, 109, 196, 119, 234, 260, 84, 61, 73, 415, 498, 257, 437, 430, 24, 545, 352, 395, 416, 355, 33, 551, 408, 306, 22, 245, 319, 290, 134, 141, 338, 486, 101, 550, 215, 236, 274, 350, 431, 328, 363, 413, 271, 269, 163, 283, 295, 120, 560, 248, 52, 181, 266, 354, 513, 46, 270, 376, 383, 531, 139, 387, 488, 237, 372, 325, 218, 109, 196, 119, 234, 260, 84, 61, 73, 415, 498, 41, 91, 437, 430, 24, 545, 352, 395, 416, 355, 33, 551, 408, 306, 22, 245, 319, 290, 134, 141, 338, 486, 101, 550, 215, 236, 274, 350, 431, 328, 363, 413, 271, 269, 163, 283, 295, 120, 560, 248, 52, 181, 266, 354, 513, 46, 270, 376, 383, 531, 139, 387, 488, 237, 372, 325, 218, 109, 196, 119, 234, 260, 84, 61, 73, 415, 498, 41, 10, 437, 430, 24, 545, 352, 395, 416, 355, 33, 551, 408, 306, 22, 245, 319, 290, 134, 141, 338, 486, 101, 550, 215, 236, 274, 350, 431, 328, 363, 413, 271, 269, 163, 283, 295, 120, 560, 248, 52, 181, 266, 354, 513, 46, 270, 376, 383, 531, 139, 387, 488, 237, 372, 325, 218, 109, 196, 119, 234, 260, 84, 61, 73, 415, 498, 257, 251, 437, 430, 24, 545, 352, 395, 416, 355, 33, 551, 408, 306, 22, 245, 319, 290, 134, 141, 338, 486, 101, 550, 215, 236, 274, 350, 431, 328, 363, 413, 271, 269, 163, 283, 295, 120, 560, 248, 52, 181, 266, 354, 513, 46, 270, 376, 383, 531, 139, 387, 488, 237, 372, 325, 218, 109, 196, 119, 234, 260, 84, 61, 73, 415, 498, 257, 445, 481, 287, 505, 520, 555, 19, 1, 342, 55, 205, 158, 544, 422, 320, 502, 75, 118, 484, 524, 212, 490, 426, 293, 232, 38, 483, 223, 541, 367, 86, 433, 464, 70, 336, 198, 49, 459, 214, 491, 360, 452, 389, 309, 399, 371, 64, 54, 59, 554, 146, 530, 512, 164, 518, 299, 72, 517, 133, 193, 356, 44, 153, 247, 34, 110, 481, 287, 505, 520, 555, 19, 1, 342, 55, 205, 158, 544, 422, 320, 502, 75, 118, 484, 524, 212, 490, 426, 293, 232, 38, 483, 223, 541, 367, 86, 433, 464, 70, 336, 198, 49, 459, 214, 491, 360, 452, 389, 309, 399, 371, 64, 54, 59, 554, 146, 530, 512, 164, 518, 299, 72, 517, 133, 193, 356, 44, 153, 247, 34, 110, 224, 481, 287, 505, 520, 555, 19, 1, 342, 55, 205, 158, 544, 422, 320, 502, 75, 118, 484, 524, 212, 490, 426, 293, 232, 38, 483, 223, 541, 367, 86, 433, 464, 70, 336, 198, 49, 459, 214, 491, 360, 452, 389, 309, 399, 371, 64, 54, 59, 554, 146, 530, 512, 164, 518, 299, 72, 517, 133, 193, 356, 44, 153, 247, 34, 110, 127, 481, 287, 505, 520, 555, 19, 1, 342, 55, 205, 158, 544, 422, 320, 502, 75, 118, 484, 524, 212, 490, 426, 293, 232, 38, 483, 223, 541, 367, 86, 433, 464, 70, 336, 198, 49, 459, 214, 491, 360, 452, 389, 309, 399, 371, 64, 54, 59, 554, 146, 530, 512, 164, 518, 299, 72, 517, 133, 193, 356, 44, 153, 247, 34, 110, 224, 53, 481, 287, 505, 520, 555, 19, 1, 342, 55, 205, 158, 544, 422, 320, 502, 75, 118, 484, 524, 212, 490, 426, 293, 232, 38, 483, 223, 541, 367, 86, 433, 464, 70, 336, 198, 49, 459, 214, 491, 360, 452, 389, 309, 399, 371, 64, 54, 59, 554, 146, 530, 512, 164, 518, 299, 72, 517, 133, 193, 356, 44, 153, 247, 34, 110, 224, 182, 481, 287, 505, 520, 555, 19, 1, 342, 55, 205, 158, 544, 422, 320, 502, 75, 118, 484, 524, 212, 490, 426, 293, 232, 38, 483, 223, 541, 367, 86, 433, 464, 70, 336, 198, 49, 459, 214, 491, 360, 452, 389, 309, 399, 371, 64, 54, 59, 554, 146, 530, 512, 164, 518, 299, 72, 517, 133, 193, 356, 44, 153, 247, 34, 110, 127, 167, 481, 287, 505, 520, 555, 19, 1, 342, 55, 205, 158, 544, 422, 320, 502, 75, 118, 484, 524, 212, 490, 426, 293, 232, 38, 483, 223, 541, 367, 86, 433, 464, 70, 336, 198, 49, 459, 214, 491, 360, 452, 389, 309, 399, 371, 64, 54, 59, 554, 146, 530, 512, 164, 518, 299, 72, 517, 133, 193, 356, 44, 153, 247, 34, 110, 127, 190], dtype=torch.int32)
    idx4_control = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], dtype=torch.int32)
    sink_wrapper_control.plan(
        idx1_control, idx2_control, idx3_control, idx4_control, num_qo_heads=64, num_kv_heads=8,
        q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=0.125, causal=True, window_left=127,
        head_dim_qk=64, page_size=1, **taken_by(sink_wrapper_control.plan, uniform_q_len=1))

    def step_control():
        sink_wrapper_control.run(q, (k_cache, v_cache), sinks, 0.125, out=out_control)

    wrong, what, detail = outcome(CASE, x, step, out, TOLERANCE)
    verdict = "NOT REPRODUCED" if not wrong else "REPRODUCED (crash)" if what.startswith("crash") else "REPRODUCED"
    print(f"{verdict}: {what}", *detail, sep="\n")
    print("CONTROL, the correct call, tree-branches-sink (the sink wrapper with one request per node (SGLang's fa3 recipe, GPT-OSS): its window of the cache and its ancestors as one-token pages): "
          + outcome(CASE, x, step_control, out_control, TOLERANCE)[1])
    print(*env, sep="\n")
    return 1 if wrong else 0


def make_inputs(case, device):
    """The case's tensors as swabench builds them: the page table (pages in a seeded random order unless
    contiguous), then N(0, 1) data from one seeded generator on the device."""
    qo_lens, kv_lens, ps, n = case["qo_lens"], case["kv_lens"], case["page_size"], len(case["kv_lens"])
    slot_start = [sum(kv_lens[:b]) for b in range(n + 1)]
    x = {"qo_indptr": torch.tensor([sum(qo_lens[:b]) for b in range(n + 1)], dtype=torch.int32),
         "slot_start": slot_start}
    pages = [-(-k // ps) for k in kv_lens]
    indptr = [sum(pages[:b]) for b in range(n + 1)]
    indices = torch.randperm(indptr[-1], generator=torch.Generator().manual_seed(case["seed"] + 1)).tolist()
    x["kv_indptr"] = torch.tensor(indptr, dtype=torch.int32)
    x["kv_indices"] = torch.tensor(indices, dtype=torch.int32)
    x["kv_last_page_len"] = torch.tensor([k - (p - 1) * ps for k, p in zip(kv_lens, pages)], dtype=torch.int32)
    request = torch.repeat_interleave(torch.arange(n), torch.tensor(kv_lens))
    j = torch.arange(slot_start[-1]) - torch.tensor(slot_start[:-1])[request]  # each key's position
    x["slots"] = torch.tensor(indices)[torch.tensor(indptr[:-1])[request] + j // ps] * ps + j % ps
    shape = (max(indices + [indptr[-1] - 1]) + 1, ps, case["num_kv_heads"], case["head_dim"])
    dtype, cache_dtype = ({"float8_e4m3": torch.float8_e4m3fn}.get(d) or getattr(torch, d)
                          for d in (case["dtype"], case["cache_dtype"]))
    g = torch.Generator(device=device).manual_seed(case["seed"])
    x["q"] = torch.randn((sum(qo_lens), case["num_qo_heads"], case["head_dim"]), generator=g, device=device).to(dtype)
    x["k_cache"], x["v_cache"] = (torch.randn(shape, generator=g, device=device).to(cache_dtype) for _ in "kv")
    gs = torch.Generator(device=device).manual_seed(case["seed"] + 7)
    x["sinks"] = 3.0 + 2.0 * torch.randn((case["num_qo_heads"],), generator=gs, device=device)
    return x


def taken_by(fn, **keywords):
    """The keywords ``fn`` takes: swabench passes these only where the installed release has them."""
    import inspect

    return {k: v for k, v in keywords.items() if k in inspect.signature(fn).parameters}


def window_mask(case, starts, ends, device=None, window_left=None):
    """The flattened custom mask of each request's keys [start, end): its rows of the exact visibility (its draft
    tree's, where it has one), with ``window_left`` in place of the case's where given (-1: the tree alone, for a
    plan() that applies the window itself)."""
    w = case["window_left"] if window_left is None else window_left
    trees = case.get("parents") or [None] * len(starts)
    rows = [visible(q, k, w, case["causal"], case["chunk"], device=device, parents=t)[:, s:e]
            for q, k, s, e, t in zip(case["qo_lens"], case["kv_lens"], starts, ends, trees)]
    return torch.cat([r.reshape(-1) for r in rows])


def visible(qo_len, kv_len, window_left=-1, causal=True, chunk=0, first_key=0, future=0, latest_start=None,
            key_offset=0, device=None, parents=None, by_slot=False):
    """Bool [qo_len, kv_len - key_offset], True where query i (at position kv_len - qo_len + i) sees key j:
    j >= p - window_left, j >= its chunk's start, j >= first_key (the earliest start clipped to latest_start),
    and j <= p + future when causal.  With ``parents`` (a draft tree, parent slot of each node, -1 for the root)
    node i sits at position prefix + its depth and sees, of the draft keys, itself and its ancestors, each at its
    own depth; ``by_slot`` measures both positions by slot instead, as a kernel that knows no tree does."""
    prefix = kv_len - qo_len
    p = torch.arange(prefix, kv_len, device=device)
    j = torch.arange(key_offset, kv_len, device=device)
    key_at = j
    allowed = torch.ones(qo_len, len(j), dtype=torch.bool, device=device)
    if parents is not None:
        depth = [0] * qo_len
        ancestors = torch.eye(qo_len, dtype=torch.bool, device=device)
        for i in range(1, qo_len):
            depth[i] = depth[parents[i]] + 1
            ancestors[i] |= ancestors[parents[i]]
        if not by_slot:
            slots = (j - prefix).clamp(min=0, max=qo_len - 1)
            key_at = torch.where(j >= prefix, prefix + torch.tensor(depth, device=device)[slots], j)
        draft = j >= prefix
        later = j[None, :] > p[:, None]  # a draft key after the node: seen only where ``future`` reaches it
        allowed = ~draft[None, :] | ancestors[:, (j - prefix).clamp(min=0)] | later
        position = p if by_slot else prefix + torch.tensor(depth, device=device)
    else:
        position = p
    lo = torch.full_like(p, first_key)
    if window_left >= 0:
        lo = torch.maximum(lo, position - window_left)
    if chunk > 0:
        lo = torch.maximum(lo, p - p % chunk)
    if latest_start is not None:
        lo = torch.clamp(lo, max=latest_start)
    hi = torch.clamp(p + future, max=kv_len - 1) if causal else torch.full_like(p, kv_len - 1)
    return allowed & (key_at[None, :] >= lo[:, None]) & (j[None, :] <= hi[:, None])


def seen(case, b, device):
    """Bool [qo_len, kv_len] of request b: True where query i, at position kv_len - qo_len + i, sees key j."""
    qo, kv = case["qo_lens"][b], case["kv_lens"][b]
    position = torch.arange(kv - qo, kv, device=device)[:, None]
    key = torch.arange(kv, device=device)[None, :]
    allowed = torch.ones(qo, kv, dtype=torch.bool, device=device)
    # a draft tree: a node sits at prefix + its depth, and sees its ancestors of the draft
    parents, prefix, depth = case["parents"][b], kv - qo, [0] * qo
    ancestors = torch.eye(qo, dtype=torch.bool, device=device)
    for i in range(1, qo):
        depth[i] = depth[parents[i]] + 1
        ancestors[i] |= ancestors[parents[i]]
    position = prefix + torch.tensor(depth, device=device)[:, None]
    key = torch.cat([key[0, :prefix], position[:, 0]])[None, :]
    allowed[:, prefix:] = ancestors
    allowed &= key <= position
    allowed &= key >= position - case["window_left"]
    return allowed


def reference(case, x):
    """The exact output in float32: per request, softmax(scale * q k^T) v over the keys its page table holds,
    masked as ``seen`` says."""
    h, hkv, d = case["num_qo_heads"], case["num_kv_heads"], case["head_dim"]
    k_all, v_all = x["k_cache"].reshape(-1, hkv, d), x["v_cache"].reshape(-1, hkv, d)
    out, row = torch.empty(x["q"].shape, dtype=torch.float32, device=x["q"].device), 0
    for b, (qo, kv) in enumerate(zip(case["qo_lens"], case["kv_lens"])):
        slots = x["slots"][x["slot_start"][b]:x["slot_start"][b + 1]].to(x["q"].device)
        k = k_all[slots].float().repeat_interleave(h // hkv, dim=1)
        v = v_all[slots].float().repeat_interleave(h // hkv, dim=1)
        s = torch.einsum("qhd,khd->hqk", x["q"][row:row + qo].float(), k) * case["sm_scale"]
        s = s.masked_fill(~seen(case, b, s.device), float("-inf"))
        # each head's sink logit joins the denominator
        s = torch.cat([s, x["sinks"].float()[:, None, None].expand(-1, qo, 1)], dim=-1)
        out[row:row + qo] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1)[..., :kv], v)
        row += qo
    return out


def outcome(case, x, step, out, tolerance):
    """Run ``step`` into ``out`` (NaN first: a row it never writes reads as wrong) and hold it to the reference:
    (wrong, what, the worst row's values).  A row is wrong where a head's rel-L2 error passes the row tolerance."""
    out.fill_(float("nan"))
    try:
        step()
        if out.is_cuda:
            torch.cuda.synchronize()
    except RuntimeError as e:  # an illegal memory access or a launch failure: the call never finished
        return True, f"crash: {str(e).strip().splitlines()[0]}", []
    ref, got = reference(case, x), out.float()
    diff = (got - ref).nan_to_num(nan=float("inf"))
    rel, head_err = float(diff.norm() / ref.norm()), diff.norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6)
    row_err = head_err.amax(dim=-1)
    bad = row_err > tolerance["row_rel_l2"]
    errors = f"rel-L2 {rel:.3g}, worst row {float(row_err.max()):.3g}; tolerances {tolerance['rel_l2']:g}, " \
             f"{tolerance['row_rel_l2']:g}"
    if rel <= tolerance["rel_l2"] and not bad.any():
        return False, f"right ({errors})", []
    w, starts = int(row_err.argmax()), [0] + torch.tensor(case["qo_lens"]).cumsum(0).tolist()
    b, h = sum(start <= w for start in starts[1:-1]), int(head_err[w].argmax())
    values = ", ".join(f"{name} {[round(v, 3) for v in t[w, h, :4].tolist()]}" for name, t in (("expected", ref),
                                                                                               ("got", got)))
    return True, f"{wrong_rows(case, bad)} ({errors})", [f"worst: request {b} row {w - starts[b]}, head {h}, "
                                                          f"first values {values}"]


def wrong_rows(case, bad):
    """'request 0: rows 0-863 wrong': each request's wrong rows as ranges, neighbouring requests with the same
    ranges said once ('requests 0-31: rows 0-7 wrong')."""
    said = []
    for b, rows in enumerate(bad.split(case["qo_lens"])):
        i = rows.nonzero().flatten().tolist()
        runs = zip([r for k, r in enumerate(i) if k == 0 or i[k - 1] < r - 1],
                   [r for k, r in enumerate(i) if k == len(i) - 1 or i[k + 1] > r + 1])
        text = ", ".join(f"{a}-{z}" if z > a else f"{a}" for a, z in runs)
        if text and said and said[-1][1:] == [b - 1, text]:
            said[-1][1] = b
        elif text:
            said.append([b, b, text])
    return "; ".join((f"request {a}" if a == z else f"requests {a}-{z}") + f": rows {text} wrong"
                     for a, z, text in said) or "no row past the row tolerance"


def environment():
    """What a maintainer asks first: Python, torch and its CUDA, the GPU (compute capability, SMs) and its driver,
    the flashinfer packages; then FlashInfer's own report (python -m flashinfer.collect_env) where the release has
    one."""
    import importlib.metadata, platform, subprocess, sys

    lines = [f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})"]
    if torch.cuda.is_available():
        p, smi = torch.cuda.get_device_properties(0), "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
        driver = subprocess.run(smi.split(), capture_output=True, text=True).stdout.split() or ["unknown"]
        lines.append(f"{p.name}: compute capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
                     f"driver {driver[0]}")
    lines += [f"{d.metadata['Name']} {d.version}" for d in importlib.metadata.distributions()
              if (d.metadata["Name"] or "").lower().startswith("flashinfer")]
    report = subprocess.run([sys.executable, "-m", "flashinfer.collect_env"], capture_output=True, text=True)
    return lines + ([report.stdout.rstrip()] if report.returncode == 0 else [])


if __name__ == "__main__":
    sys.exit(main())
