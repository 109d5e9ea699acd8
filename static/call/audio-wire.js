// The call page's audio on the wire: binary frames, with base64 JSON understood on the way in.
//
// The server accepts and (after `session.update` with `duplex.binary_audio: true`) sends binary
// frames: byte 0 is the kind (0x01 = audio), the rest pcm16 little-endian at 24 kHz
// (docs/protocol.md). Base64 in JSON costs a third more bytes, a string to build and parse per
// 20 ms piece on both ends; stock OpenAI clients keep it, and the page still decodes it for
// the audio the server sends before it has applied the update.

export const AUDIO_FRAME_KIND = 0x01;

/** One binary audio frame: the kind byte, then Float32 samples in [-1, 1] as pcm16 little-endian. */
export function encodeAudioFrame(samples) {
  const frame = new DataView(new ArrayBuffer(1 + 2 * samples.length));
  frame.setUint8(0, AUDIO_FRAME_KIND);
  for (let i = 0; i < samples.length; i++) {
    const clamped = Math.max(-1, Math.min(1, samples[i]));
    frame.setInt16(1 + 2 * i, clamped < 0 ? clamped * 32768 : clamped * 32767, true);
  }
  return frame.buffer;
}

/** The pcm16 samples of a binary audio frame, or null for another kind (or an empty frame). */
export function decodeAudioFrame(buffer) {
  const view = new DataView(buffer);
  if (view.byteLength < 1 || view.getUint8(0) !== AUDIO_FRAME_KIND) return null;
  const pcm = new Int16Array((view.byteLength - 1) >> 1); // an odd trailing byte is not a sample
  for (let i = 0; i < pcm.length; i++) pcm[i] = view.getInt16(1 + 2 * i, true);
  return pcm;
}

/** base64 pcm16 little-endian (`response.output_audio.delta`) -> samples. Throws on bad base64. */
export function base64ToInt16(b64) {
  const bytes = Uint8Array.fromBase64(b64);
  const view = new DataView(bytes.buffer);
  const pcm = new Int16Array(bytes.length >> 1);
  for (let i = 0; i < pcm.length; i++) pcm[i] = view.getInt16(2 * i, true);
  return pcm;
}
