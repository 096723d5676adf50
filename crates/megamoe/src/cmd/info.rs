//! `megamoe info`: GPUs, peer access, library versions and the JIT cache.

use megamoe_cuda::{jit, probe, Gpu};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let v = probe::versions();
    match &v.driver {
        Ok((ver, path)) => println!("driver   CUDA {}.{} ({path})", ver / 1000, ver % 1000 / 10),
        Err(e) => println!("driver   {e}"),
    }
    match &v.nvrtc {
        Ok(((major, minor), path)) => println!("nvrtc    {major}.{minor} ({path})"),
        Err(e) => println!("nvrtc    {e}"),
    }
    match &v.nccl {
        Ok((ver, path)) => println!(
            "nccl     {}.{}.{} ({path})",
            ver / 10000,
            ver % 10000 / 100,
            ver % 100
        ),
        Err(e) => println!("nccl     {e}"),
    }
    match probe::cuda_include_dir() {
        Some(d) => println!("headers  {}", d.display()),
        None => println!("headers  none found (megamoe's kernels need none)"),
    }
    let dir = jit::cache::dir();
    let (entries, bytes) = jit::cache::summary(&dir);
    println!(
        "jit      cache {} ({entries} kernels, {:.1} MB)",
        dir.display(),
        bytes as f64 / 1e6
    );
    let gpus = match megamoe_cuda::device_count() {
        Ok(0) => {
            println!("gpus     none visible");
            return Ok(());
        }
        Ok(_) => Gpu::all()?,
        Err(e) => {
            println!("gpus     {e}");
            return Ok(());
        }
    };
    for g in &gpus {
        let p = g.props();
        println!(
            "gpu {}    {} sm_{}{} {} SMs, {:.0} GiB, L2 {} MiB, smem/block {} KB, PCI bus {}",
            g.ordinal(),
            p.name,
            p.compute_capability.0,
            p.compute_capability.1,
            p.sm_count,
            p.total_memory as f64 / (1u64 << 30) as f64,
            p.l2_bytes >> 20,
            p.max_shared_per_block / 1024,
            p.pci_bus
        );
    }
    for a in &gpus {
        let peers: Vec<String> = gpus
            .iter()
            .filter(|b| b.ordinal() != a.ordinal())
            .map(|b| {
                let can = a
                    .can_access_peer(b)
                    .map_or("?", |c| if c { "yes" } else { "no" });
                format!("{}->{}: {can}", a.ordinal(), b.ordinal())
            })
            .collect();
        if !peers.is_empty() {
            println!("peer     {}", peers.join(", "));
        }
    }
    Ok(())
}
