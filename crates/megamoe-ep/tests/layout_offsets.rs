//! The byte offsets the kernels receive, pinned for a few buffers: the device code addresses
//! every region by them, so a change here is a change of the kernels' behaviour.

use megamoe_ep::{BufferLayout, BufferSpec, HandleLayout};

fn spec(
    ranks: usize,
    experts: usize,
    topk: usize,
    hidden: usize,
    max_tokens: usize,
    max_pad_multiple: usize,
) -> BufferSpec {
    BufferSpec {
        ranks,
        experts,
        topk,
        hidden,
        max_tokens,
        max_pad_multiple,
    }
}

#[test]
fn buffer_offsets_are_the_ones_the_kernels_were_written_for() {
    let cases = [
        (
            spec(2, 256, 6, 4096, 4096, 128),
            BufferLayout {
                epochs: 0,
                signals: 256,
                status: 512,
                counts: 768,
                meta: 33792,
                in_rows: 328704,
                in_scales: 33883136,
                out_rows: 34407424,
                out_scales: 570229760,
                out_probs: 578601984,
                comb_rows: 578863616,
                comb_prob_grads: 1114685952,
                error: 1114947584,
                size: 1114947840,
            },
        ),
        (
            spec(8, 384, 6, 7168, 8192, 128),
            BufferLayout {
                epochs: 0,
                signals: 256,
                status: 512,
                counts: 768,
                meta: 33792,
                in_rows: 623616,
                in_scales: 118064128,
                out_rows: 119899136,
                out_scales: 5845124096,
                out_probs: 5934580736,
                comb_rows: 5936178176,
                comb_prob_grads: 11661403136,
                error: 11663000576,
                size: 11663000832,
            },
        ),
        (
            spec(4, 16, 4, 256, 100, 1),
            BufferLayout {
                epochs: 0,
                signals: 256,
                status: 512,
                counts: 768,
                meta: 33792,
                in_rows: 38656,
                in_scales: 89856,
                out_rows: 90880,
                out_scales: 910080,
                out_probs: 922880,
                comb_rows: 929280,
                comb_prob_grads: 1748480,
                error: 1754880,
                size: 1755136,
            },
        ),
        (
            spec(1, 8, 2, 128, 3, 64),
            BufferLayout {
                epochs: 0,
                signals: 256,
                status: 512,
                counts: 768,
                meta: 33792,
                in_rows: 34048,
                in_scales: 34816,
                out_rows: 35072,
                out_scales: 166144,
                out_probs: 168192,
                comb_rows: 170240,
                comb_prob_grads: 301312,
                error: 303360,
                size: 303616,
            },
        ),
    ];
    for (s, want) in cases {
        assert_eq!(BufferLayout::new(&s), want, "{s:?}");
    }
}

#[test]
fn handle_offsets_are_the_ones_the_kernels_were_written_for() {
    let cases = [
        (
            spec(2, 256, 6, 4096, 4096, 128),
            HandleLayout {
                recv_slot: 0,
                send_row: 196608,
                idx: 294912,
                padded: 393216,
                counts: 393728,
                seg_base: 394240,
                src_tokens: 394752,
                total_rows: 395008,
                size: 395264,
            },
        ),
        (
            spec(8, 384, 6, 7168, 8192, 128),
            HandleLayout {
                recv_slot: 0,
                send_row: 1572864,
                idx: 1769472,
                padded: 1966080,
                counts: 1966336,
                seg_base: 1966592,
                src_tokens: 1966848,
                total_rows: 1967104,
                size: 1967360,
            },
        ),
        (
            spec(4, 16, 4, 256, 100, 1),
            HandleLayout {
                recv_slot: 0,
                send_row: 6400,
                idx: 8192,
                padded: 9984,
                counts: 10240,
                seg_base: 10496,
                src_tokens: 10752,
                total_rows: 11008,
                size: 11264,
            },
        ),
        (
            spec(1, 8, 2, 128, 3, 64),
            HandleLayout {
                recv_slot: 0,
                send_row: 256,
                idx: 512,
                padded: 768,
                counts: 1024,
                seg_base: 1280,
                src_tokens: 1536,
                total_rows: 1792,
                size: 2048,
            },
        ),
    ];
    for (s, want) in cases {
        assert_eq!(HandleLayout::new(&s), want, "{s:?}");
    }
}
