//! The hardware floor of every benchmark table (SPEC §8): the machine limits measured on our
//! H200 pair (docs/PEERS.md, "Our machine") and the least time a piece of work can take under them.

/// Dense FP8 GEMM rate of one GPU, FLOP/s: cuBLAS 8192³ with per-tensor scales measured
/// 1394 TFLOP/s.
pub const FP8_FLOPS: f64 = 1394e12;

/// HBM rate of one GPU, bytes/s: the device-to-device copy measured 4.18 TB/s (read and write
/// counted), rounded as SPEC §8 states it.
pub const HBM_BYTES_PER_S: f64 = 4.2e12;

/// NVLink rate of one GPU per direction, bytes/s: SM pulls and pushes measured 364–372 GB/s.
pub const NVLINK_BYTES_PER_S: f64 = 365e9;

/// Seconds of the floor: whichever of the FLOPs, the HBM bytes and the NVLink bytes (per
/// direction) takes longest at the measured rates.
pub fn floor_seconds(flops: f64, hbm_bytes: f64, nvlink_bytes: f64) -> f64 {
    (flops / FP8_FLOPS)
        .max(hbm_bytes / HBM_BYTES_PER_S)
        .max(nvlink_bytes / NVLINK_BYTES_PER_S)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_resource_sets_the_floor() {
        assert_eq!(floor_seconds(0.0, 0.0, 0.0), 0.0);
        assert_eq!(floor_seconds(1394e12, 0.0, 0.0), 1.0);
        assert_eq!(floor_seconds(1394e12, 8.4e12, 0.0), 2.0);
        assert_eq!(floor_seconds(1394e12, 8.4e12, 1095e9), 3.0);
        assert_eq!(floor_seconds(0.0, 4.2e12, 365e9), 1.0);
    }
}
