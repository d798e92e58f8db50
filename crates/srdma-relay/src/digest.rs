//! (digest: being written)
