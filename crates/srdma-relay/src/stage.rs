//! (stage: being written)
