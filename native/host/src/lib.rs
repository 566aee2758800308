//! The ztunnel-node daemon's process concerns, apart from the mesh and the connections: glibc's allocator settings
//! (`alloc`), giving back the code pages startup ran once (`footprint`), the CPU and heap profiles of the admin's
//! /debug/pprof endpoints (`profile`, `heap_profile`: its sampling allocator is the binding's global allocator), and
//! the connection silos, one thread with a single-threaded runtime each (`silo`). The dataplane builds on it.

pub mod alloc;
pub mod footprint;
pub mod heap_profile;
pub mod profile;
pub mod silo;
