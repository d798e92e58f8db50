//! (source: being written)
