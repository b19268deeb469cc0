//! node-maintenance-controller: declarative, PDB-aware node drains (spec §4-§7).

pub mod types;
