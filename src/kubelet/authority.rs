//! An HTTP/2 front for a gRPC server that clients dial with a socket path as `:authority`.
//!
//! kubelet's plugin watcher (1.36.3, `operation_generator.go`'s `dial`) calls
//! `grpc.DialContext(path, WithContextDialer(...))` without `grpc.WithAuthority`, so grpc-go
//! sends the registration socket's path (`/var/lib/kubelet/plugins_registry/...-reg.sock`) as
//! the request's `:authority`. h2's server (0.4.20, `convert_poll_message`) parses it as an
//! `http::uri::Authority`, fails, and resets the stream with PROTOCOL_ERROR: GetInfo never
//! answers and kubelet never registers the driver. kubelet cannot be changed, so each
//! connection passes through [`front`], which rewrites such an `:authority` to `localhost` and
//! passes everything else on untouched.
//!
//! Client to server, frame by frame: a HEADERS frame and its CONTINUATIONs (one header block)
//! are decoded with an HPACK decoder that mirrors the client's encoder, an `:authority` that
//! is not a valid authority is replaced, and the block is sent again as literals without
//! indexing, so the server's decoder table stays empty and never disagrees with ours. Every
//! other frame is copied byte for byte as it comes, however long. Server to client is a plain
//! copy. A malformed frame or header block ends that connection only.

use std::borrow::Cow;
use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The client connection preface (RFC 9113 section 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// What an invalid `:authority` becomes: what grpc-go sends for a `unix:` target.
pub const REPLACEMENT: &[u8] = b"localhost";
/// The largest encoded header block taken (gRPC's headers are a few hundred bytes).
pub const MAX_BLOCK: usize = 64 * 1024;
/// The largest decoded header list taken, names and values together: indexed fields can make
/// a small block decode to much more.
pub const MAX_DECODED: usize = 256 * 1024;
/// The HPACK dynamic table size the server advertises: tonic leaves h2's default, 4096, so the
/// client's encoder never grows its table past it, and a size update past it is refused.
pub const TABLE_SIZE: usize = 4096;
/// The frame size every HTTP/2 peer takes (SETTINGS_MAX_FRAME_SIZE's initial value): the
/// rewritten block is cut into frames of at most this.
pub const FRAME_SIZE: usize = 16384;

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    #[error("the client's preface is not HTTP/2's: {0:02x?}")]
    Preface(Vec<u8>),
    #[error("HEADERS on stream {stream}: {need} bytes of padding and priority in a {len}-byte payload")]
    Padding { stream: u32, need: usize, len: usize },
    #[error("stream {stream}: a header block over {MAX_BLOCK} bytes")]
    BlockTooLarge { stream: u32 },
    #[error("stream {stream}: a header block over {MAX_DECODED} bytes decoded")]
    ListTooLarge { stream: u32 },
    #[error("a CONTINUATION of stream {expected} expected, got frame type {kind:#x} on stream {got}")]
    Continuation { expected: u32, kind: u8, got: u32 },
    #[error("a CONTINUATION on stream {stream} with no header block open")]
    StrayContinuation { stream: u32 },
    #[error("HEADERS on stream 0")]
    StreamZero,
    #[error("stream {stream}: the header block does not decode: {message}")]
    Hpack { stream: u32, message: String },
    #[error("{0}")]
    Io(#[from] io::Error),
}

type Result<T> = std::result::Result<T, AuthorityError>;

/// A frame's 9-byte header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl FrameHeader {
    pub fn parse(b: &[u8; 9]) -> FrameHeader {
        FrameHeader {
            len: (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        let len = self.len as u32;
        out.extend_from_slice(&len.to_be_bytes()[1..]);
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&self.stream.to_be_bytes());
    }
}

/// A header block being gathered: its HEADERS came, its END_HEADERS not yet.
struct Open {
    stream: u32,
    end_stream: bool,
    block: Vec<u8>,
}

/// The client-to-server state of one connection: the decoder mirroring the client's encoder,
/// and the header block in progress.
pub struct Rewriter {
    decoder: loona_hpack::Decoder<'static>,
    open: Option<Open>,
}

impl Default for Rewriter {
    fn default() -> Self {
        Rewriter::new()
    }
}

/// Whether h2's server takes `value` as `:authority` (it parses it exactly so).
pub fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

impl Rewriter {
    pub fn new() -> Rewriter {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        Rewriter { decoder, open: None }
    }

    /// Whether a header block is open: only its CONTINUATION may come next.
    pub fn in_block(&self) -> bool {
        self.open.is_some()
    }

    /// Takes one HEADERS or CONTINUATION frame; once the block is complete, appends the frames
    /// to send in its place to `out`.
    pub fn header_frame(&mut self, h: FrameHeader, payload: &[u8], out: &mut Vec<u8>) -> Result<()> {
        match (h.kind, self.open.as_mut()) {
            (HEADERS, None) => {
                if h.stream == 0 {
                    return Err(AuthorityError::StreamZero);
                }
                let mut start = 0;
                let mut pad = 0;
                if h.flags & PADDED != 0 {
                    pad = usize::from(*payload.first().ok_or(AuthorityError::Padding {
                        stream: h.stream,
                        need: 1,
                        len: 0,
                    })?);
                    start = 1;
                }
                if h.flags & PRIORITY != 0 {
                    start += 5;
                }
                if start + pad > payload.len() {
                    return Err(AuthorityError::Padding {
                        stream: h.stream,
                        need: start + pad,
                        len: payload.len(),
                    });
                }
                let fragment = &payload[start..payload.len() - pad];
                if fragment.len() > MAX_BLOCK {
                    return Err(AuthorityError::BlockTooLarge { stream: h.stream });
                }
                self.open = Some(Open {
                    stream: h.stream,
                    end_stream: h.flags & END_STREAM != 0,
                    block: fragment.to_vec(),
                });
            }
            (CONTINUATION, Some(open)) if open.stream == h.stream => {
                if open.block.len() + payload.len() > MAX_BLOCK {
                    return Err(AuthorityError::BlockTooLarge { stream: h.stream });
                }
                open.block.extend_from_slice(payload);
            }
            (CONTINUATION, None) => return Err(AuthorityError::StrayContinuation { stream: h.stream }),
            (kind, Some(open)) => {
                return Err(AuthorityError::Continuation {
                    expected: open.stream,
                    kind,
                    got: h.stream,
                })
            }
            (kind, None) => {
                return Err(AuthorityError::Continuation {
                    expected: h.stream,
                    kind,
                    got: h.stream,
                })
            }
        }
        if h.flags & END_HEADERS != 0 {
            if let Some(open) = self.open.take() {
                self.finish(open, out)?;
            }
        }
        Ok(())
    }

    fn finish(&mut self, open: Open, out: &mut Vec<u8>) -> Result<()> {
        let stream = open.stream;
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut size = 0usize;
        let mut over = false;
        self.decoder
            .decode_with_cb(&open.block, |name: Cow<[u8]>, value: Cow<[u8]>| {
                size += name.len() + value.len();
                if size > MAX_DECODED {
                    over = true;
                } else {
                    fields.push((name.into_owned(), value.into_owned()));
                }
            })
            .map_err(|e| AuthorityError::Hpack {
                stream,
                message: format!("{e:?}"),
            })?;
        if over {
            return Err(AuthorityError::ListTooLarge { stream });
        }
        let mut block = Vec::with_capacity(open.block.len() + 64);
        for (name, value) in &fields {
            let value: &[u8] = if name == b":authority" && !valid_authority(value) {
                REPLACEMENT
            } else {
                value
            };
            encode_literal(name, value, &mut block);
        }
        write_block(stream, open.end_stream, &block, out);
        Ok(())
    }
}

/// An HPACK integer with an `n`-bit prefix whose high bits are `first` (RFC 7541 5.1).
fn encode_integer(mut value: usize, n: u8, first: u8, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2): the
/// server's decoder adds nothing to its table.
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    encode_integer(name.len(), 7, 0, out);
    out.extend_from_slice(name);
    encode_integer(value.len(), 7, 0, out);
    out.extend_from_slice(value);
}

/// `block` as one HEADERS frame, or HEADERS and CONTINUATIONs of at most [`FRAME_SIZE`].
fn write_block(stream: u32, end_stream: bool, block: &[u8], out: &mut Vec<u8>) {
    let mut chunks = block.chunks(FRAME_SIZE).peekable();
    let mut kind = HEADERS;
    let mut first_flags = if end_stream { END_STREAM } else { 0 };
    if chunks.peek().is_none() {
        FrameHeader {
            len: 0,
            kind,
            flags: first_flags | END_HEADERS,
            stream,
        }
        .write(out);
        return;
    }
    while let Some(chunk) = chunks.next() {
        let last = chunks.peek().is_none();
        FrameHeader {
            len: chunk.len(),
            kind,
            flags: first_flags | if last { END_HEADERS } else { 0 },
            stream,
        }
        .write(out);
        out.extend_from_slice(chunk);
        kind = CONTINUATION;
        first_flags = 0;
    }
}

/// Client to server: the preface, then frame by frame, header blocks through `Rewriter`.
async fn upstream<R, W>(mut client: R, mut server: W) -> Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    client.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(AuthorityError::Preface(preface.to_vec()));
    }
    server.write_all(&preface).await?;
    let mut rewriter = Rewriter::new();
    let mut out = Vec::new();
    loop {
        let mut raw = [0u8; 9];
        match client.read_exact(&mut raw).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e.into()),
        }
        let h = FrameHeader::parse(&raw);
        if h.kind == HEADERS || h.kind == CONTINUATION || rewriter.in_block() {
            // Padding (at most 255) and priority (5) come on top of the block's own cap.
            if h.len > MAX_BLOCK + 261 {
                return Err(AuthorityError::BlockTooLarge { stream: h.stream });
            }
            let mut payload = vec![0u8; h.len];
            client.read_exact(&mut payload).await?;
            out.clear();
            rewriter.header_frame(h, &payload, &mut out)?;
            if !out.is_empty() {
                server.write_all(&out).await?;
                server.flush().await?;
            }
        } else {
            server.write_all(&raw).await?;
            let copied = tokio::io::copy(&mut (&mut client).take(h.len as u64), &mut server).await?;
            if copied != h.len as u64 {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
            }
            server.flush().await?;
        }
    }
    server.shutdown().await?;
    Ok(())
}

/// Passes one connection from `client` to `server` and back, rewriting an invalid
/// `:authority` on the way in. Returns when both directions have ended, or at the first
/// malformed frame (the connection is dropped then).
pub async fn front<C, S>(client: C, server: S) -> Result<()>
where
    C: AsyncRead + AsyncWrite,
    S: AsyncRead + AsyncWrite,
{
    let (client_read, mut client_write) = tokio::io::split(client);
    let (mut server_read, server_write) = tokio::io::split(server);
    let down = async move {
        tokio::io::copy(&mut server_read, &mut client_write).await?;
        client_write.shutdown().await?;
        Ok::<(), AuthorityError>(())
    };
    tokio::try_join!(upstream(client_read, server_write), down)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &[u8] = b"/var/lib/kubelet/plugins_registry/gpu-memory.vramgate.dev-reg.sock";

    fn request(authority: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":path".to_vec(), b"/pluginregistration.Registration/GetInfo".to_vec()),
            (b":authority".to_vec(), authority.to_vec()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
            (b"te".to_vec(), b"trailers".to_vec()),
        ]
    }

    fn encode(encoder: &mut loona_hpack::Encoder, fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        encoder.encode(fields.iter().map(|(n, v)| (&n[..], &v[..])))
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        FrameHeader {
            len: payload.len(),
            kind,
            flags,
            stream,
        }
        .write(&mut out);
        out.extend_from_slice(payload);
        out
    }

    /// Runs `input` (after the preface) through the front's client-to-server side.
    fn through(input: &[u8]) -> Result<Vec<u8>> {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut wire = PREFACE.to_vec();
        wire.extend_from_slice(input);
        let mut out = Vec::new();
        rt.block_on(upstream(&wire[..], &mut out))?;
        assert_eq!(&out[..24], PREFACE);
        Ok(out[24..].to_vec())
    }

    /// The frames in `bytes`, each with its payload.
    fn frames(mut bytes: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
        let mut all = Vec::new();
        while !bytes.is_empty() {
            let h = FrameHeader::parse(bytes[..9].try_into().unwrap());
            all.push((h, bytes[9..9 + h.len].to_vec()));
            bytes = &bytes[9 + h.len..];
        }
        all
    }

    /// The header lists the server's decoder reads from `bytes`, one per header block.
    /// Each as (stream, END_STREAM, fields).
    fn server_reads(decoder: &mut loona_hpack::Decoder, bytes: &[u8]) -> Vec<(u32, bool, Vec<(Vec<u8>, Vec<u8>)>)> {
        let mut lists = Vec::new();
        let mut block = Vec::new();
        let mut first = None;
        for (h, payload) in frames(bytes) {
            match h.kind {
                HEADERS => {
                    assert_eq!(h.flags & (PADDED | PRIORITY), 0, "no padding or priority is sent");
                    first = Some(h);
                    block = payload;
                }
                CONTINUATION => block.extend_from_slice(&payload),
                _ => continue,
            }
            assert!(h.len <= FRAME_SIZE);
            if h.flags & END_HEADERS != 0 {
                let first = first.take().unwrap();
                lists.push((
                    first.stream,
                    first.flags & END_STREAM != 0,
                    decoder.decode(&block).unwrap(),
                ));
            }
        }
        lists
    }

    #[test]
    fn a_path_authority_is_rewritten_to_localhost() {
        assert!(!valid_authority(PATH), "h2 refuses the socket path");
        let mut encoder = loona_hpack::Encoder::new();
        let block = encode(&mut encoder, &request(PATH));
        let out = through(&frame(HEADERS, END_HEADERS, 1, &block)).unwrap();
        let read = server_reads(&mut loona_hpack::Decoder::new(), &out);
        assert_eq!(read, vec![(1, false, request(b"localhost"))]);
    }

    #[test]
    fn a_valid_authority_and_the_other_frames_are_left_alone() {
        let mut encoder = loona_hpack::Encoder::new();
        let block = encode(&mut encoder, &request(b"localhost:8080"));
        let settings = frame(0x4, 0, 0, &[0, 4, 0, 0, 0xff, 0xff]);
        let data = frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 5, 1, 2, 3, 4, 5]);
        let mut input = settings.clone();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block));
        input.extend(&data);
        let out = through(&input).unwrap();
        assert_eq!(&out[..settings.len()], &settings[..]);
        assert_eq!(&out[out.len() - data.len()..], &data[..]);
        let read = server_reads(&mut loona_hpack::Decoder::new(), &out);
        assert_eq!(read, vec![(1, false, request(b"localhost:8080"))]);
    }

    #[test]
    fn continuation_frames_make_one_block_and_end_stream_is_kept() {
        let mut encoder = loona_hpack::Encoder::new();
        let block = encode(&mut encoder, &request(PATH));
        let (a, rest) = block.split_at(10);
        let (b, c) = rest.split_at(20);
        let mut input = frame(HEADERS, END_STREAM, 3, a);
        input.extend(frame(CONTINUATION, 0, 3, b));
        input.extend(frame(CONTINUATION, END_HEADERS, 3, c));
        let out = through(&input).unwrap();
        let read = server_reads(&mut loona_hpack::Decoder::new(), &out);
        assert_eq!(read, vec![(3, true, request(b"localhost"))]);
    }

    #[test]
    fn padded_headers_with_priority_are_read() {
        let mut encoder = loona_hpack::Encoder::new();
        let block = encode(&mut encoder, &request(PATH));
        let mut payload = vec![7u8];
        payload.extend([0x80, 0, 0, 1, 15]);
        payload.extend(&block);
        payload.extend([0u8; 7]);
        let out = through(&frame(HEADERS, PADDED | PRIORITY | END_HEADERS, 5, &payload)).unwrap();
        let read = server_reads(&mut loona_hpack::Decoder::new(), &out);
        assert_eq!(read, vec![(5, false, request(b"localhost"))]);
    }

    #[test]
    fn dynamic_table_references_across_requests_stay_right() {
        // As grpc-go's encoder does: the first block adds the path authority to the dynamic
        // table (literal with incremental indexing, name :authority from the static table), the
        // second, after a table size update, refers to it by index 62. Our decoder must follow;
        // the server's sees literals only.
        let rpc = b"/pluginregistration.Registration/GetInfo";
        let mut head = vec![0x83, 0x86, 0x04, rpc.len() as u8];
        head.extend(rpc);
        let mut first = head.clone();
        first.extend([0x41, PATH.len() as u8]);
        first.extend(PATH);
        let mut second = vec![0x3f, 0xe1, 0x1f];
        second.extend(&head);
        second.push(0x80 | 62);
        let mut input = frame(HEADERS, END_HEADERS, 1, &first);
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, &second));
        let out = through(&input).unwrap();
        let want = |authority: &[u8]| {
            vec![
                (b":method".to_vec(), b"POST".to_vec()),
                (b":scheme".to_vec(), b"http".to_vec()),
                (b":path".to_vec(), rpc.to_vec()),
                (b":authority".to_vec(), authority.to_vec()),
            ]
        };
        let read = server_reads(&mut loona_hpack::Decoder::new(), &out);
        assert_eq!(
            read,
            vec![(1, false, want(b"localhost")), (3, true, want(b"localhost"))]
        );
        // The same second block without the first refers to nothing: refused.
        assert!(matches!(
            through(&frame(HEADERS, END_HEADERS, 3, &second)).unwrap_err(),
            AuthorityError::Hpack { stream: 3, .. }
        ));
    }

    #[test]
    fn a_block_past_the_frame_size_goes_out_in_continuations() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut fields = request(PATH);
        fields.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
        let block = encode(&mut encoder, &fields);
        let mut input = frame(HEADERS, 0, 1, &block[..16_000]);
        input.extend(frame(CONTINUATION, 0, 1, &block[16_000..32_000]));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, &block[32_000..]));
        let out = through(&input).unwrap();
        assert!(frames(&out).len() >= 3);
        let mut want = request(b"localhost");
        want.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
        let read = server_reads(&mut loona_hpack::Decoder::new(), &out);
        assert_eq!(read, vec![(1, false, want)]);
    }

    #[test]
    fn malformed_frames_are_refused() {
        let mut encoder = loona_hpack::Encoder::new();
        let block = encode(&mut encoder, &request(PATH));
        // Padding longer than the payload.
        let err = through(&frame(HEADERS, PADDED | END_HEADERS, 1, &[200, 1, 2])).unwrap_err();
        assert!(matches!(err, AuthorityError::Padding { stream: 1, .. }), "{err}");
        // A DATA frame inside a header block.
        let mut input = frame(HEADERS, 0, 1, &block[..5]);
        input.extend(frame(0x0, 0, 1, b"x"));
        let err = through(&input).unwrap_err();
        assert!(
            matches!(
                err,
                AuthorityError::Continuation {
                    expected: 1,
                    kind: 0,
                    ..
                }
            ),
            "{err}"
        );
        // A CONTINUATION with no block open, and one for another stream.
        let err = through(&frame(CONTINUATION, END_HEADERS, 1, &block)).unwrap_err();
        assert!(matches!(err, AuthorityError::StrayContinuation { stream: 1 }), "{err}");
        let mut input = frame(HEADERS, 0, 1, &block[..5]);
        input.extend(frame(CONTINUATION, END_HEADERS, 3, &block[5..]));
        assert!(matches!(
            through(&input).unwrap_err(),
            AuthorityError::Continuation { .. }
        ));
        // A header block that does not decode (an index past both tables).
        let err = through(&frame(HEADERS, END_HEADERS, 1, &[0xff, 0x80, 0x01])).unwrap_err();
        assert!(matches!(err, AuthorityError::Hpack { stream: 1, .. }), "{err}");
        // A table size update past what the server advertised.
        let err = through(&frame(HEADERS, END_HEADERS, 1, &[0x3f, 0xe1, 0x7f, 0x82])).unwrap_err();
        assert!(matches!(err, AuthorityError::Hpack { .. }), "{err}");
        // A header block past the cap, over many CONTINUATIONs.
        let mut input = frame(HEADERS, 0, 1, &[0u8; 16_000]);
        for _ in 0..5 {
            input.extend(frame(CONTINUATION, 0, 1, &[0u8; 16_000]));
        }
        assert!(matches!(
            through(&input).unwrap_err(),
            AuthorityError::BlockTooLarge { stream: 1 }
        ));
        // HEADERS on stream 0, and a preface that is not HTTP/2's.
        assert!(matches!(
            through(&frame(HEADERS, END_HEADERS, 0, &block)).unwrap_err(),
            AuthorityError::StreamZero
        ));
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let err = rt
            .block_on(upstream(&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..], Vec::new()))
            .unwrap_err();
        assert!(matches!(err, AuthorityError::Preface(_)), "{err}");
    }

    #[test]
    fn a_decoded_list_past_the_cap_is_refused() {
        // One 4000-byte entry in the table, then referred to 70 times: a small block that
        // decodes to 280 kB.
        let mut encoder = loona_hpack::Encoder::new();
        let big = vec![(b"x-a".to_vec(), vec![b'a'; 4000])];
        let mut input = frame(HEADERS, END_HEADERS, 1, &encode(&mut encoder, &big));
        let again: Vec<_> = std::iter::repeat(big[0].clone()).take(70).collect();
        let block = encode(&mut encoder, &again);
        assert!(block.len() < 100);
        input.extend(frame(HEADERS, END_HEADERS, 3, &block));
        let err = through(&input).unwrap_err();
        assert!(matches!(err, AuthorityError::ListTooLarge { stream: 3 }), "{err}");
    }
}
