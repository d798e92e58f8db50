//! The zero-copy view boilerplate every header shares (smoltcp style).

/// Defines `$name<T: AsRef<[u8]>>`: a view over a buffer that starts with a fixed-size header.
/// `new_checked` verifies the length once, after which no accessor can panic.
macro_rules! header_view {
    ($(#[$meta:meta])* $name:ident, $len:expr, $what:literal) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Header length in bytes.
            pub const LEN: usize = $len;

            /// Wraps `buffer` without checking its length; accessors may panic if it is short.
            #[inline]
            pub const fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }

            /// Wraps `buffer` after [`check_len`](Self::check_len).
            #[inline]
            pub fn new_checked(buffer: T) -> crate::Result<Self> {
                let v = Self::new_unchecked(buffer);
                v.check_len()?;
                Ok(v)
            }

            /// Fails with `Truncated` if the buffer is shorter than the header.
            #[inline]
            pub fn check_len(&self) -> crate::Result<()> {
                crate::error::need($what, self.buffer.as_ref(), Self::LEN)
            }

            /// Gives the buffer back.
            #[inline]
            pub fn into_inner(self) -> T {
                self.buffer
            }

            #[inline]
            #[allow(dead_code)]
            fn b(&self) -> &[u8] {
                self.buffer.as_ref()
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            #[inline]
            #[allow(dead_code)]
            fn bm(&mut self) -> &mut [u8] {
                self.buffer.as_mut()
            }
        }
    };
}

pub(crate) use header_view;
