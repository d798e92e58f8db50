//! (sink: being written)
