//! `seatrush bench`: placeholder while the load tool is written.
