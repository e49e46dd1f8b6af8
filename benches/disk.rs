//! The cost of durability on the disk under the state directory: a bare append + `fdatasync`
//! loop, and the temp + fsync + rename + directory fsync pattern the snapshots use. Printed
//! next to the per-message figures, because fsync latency is a property of the disk.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::Result;

use crate::stats::summary;

pub struct DiskCost {
    pub fdatasync: String,
    pub atomic_replace: String,
}

pub fn measure(dir: &Path, n: usize) -> Result<DiskCost> {
    fs::create_dir_all(dir)?;
    let path = dir.join("bench-fsync.tmp");
    let mut f = OpenOptions::new().create(true).append(true).open(&path)?;
    let line = [b'x'; 255];
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        f.write_all(&line)?;
        f.write_all(b"\n")?;
        f.sync_data()?;
        times.push(t0.elapsed());
    }
    drop(f);
    fs::remove_file(&path)?;
    let fdatasync = summary(&mut times);

    let target = dir.join("bench-replace.json");
    let body = vec![b'y'; 4096];
    let mut times = Vec::with_capacity(n / 2);
    for i in 0..n / 2 {
        let t0 = Instant::now();
        let tmp = dir.join(format!(".bench-replace.{i}.tmp"));
        let mut t = File::create(&tmp)?;
        t.write_all(&body)?;
        t.sync_all()?;
        drop(t);
        fs::rename(&tmp, &target)?;
        File::open(dir)?.sync_all()?;
        times.push(t0.elapsed());
    }
    fs::remove_file(&target)?;
    Ok(DiskCost {
        fdatasync,
        atomic_replace: summary(&mut times),
    })
}
