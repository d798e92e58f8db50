//! (chunk: being written)
