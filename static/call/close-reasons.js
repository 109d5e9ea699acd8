// Why a call ended, in words a caller understands (session.closed reasons, docs/protocol.md).
// The recording pages say the same from webapp/common/close_reasons.py: keep the two in step.

const WORDS = {
  client_close: "You hung up.",
  pause_timeout: "The call stayed paused too long, so it ended.",
  grace_expired: "The connection was lost for too long, so the call ended.",
  max_duration: "The call reached its maximum length.",
  idle_timeout: "Nothing was said for a long time, so the call ended.",
  admin_ended: "An administrator ended this call.",
  engine_failed: "The model stopped working, so the call ended.",
  replaced: "The call moved to another window or tab.",
  shutdown: "The server was restarting, so the call ended.",
  credentials_revoked: "Your access was withdrawn, so the call ended.",
};

/** The sentence for a reason; an unknown one is still shown, with spaces for underscores. */
export function closeReasonWords(reason) {
  if (!reason) return "";
  if (WORDS[reason]) return WORDS[reason];
  const spaced = String(reason).replaceAll("_", " ");
  return `${spaced.charAt(0).toUpperCase()}${spaced.slice(1)}.`;
}

// The server's refusals and failures, by close code (docs/protocol.md, "Close codes"); the error event
// before the close says more. None of them leaves a session to resume.
export const CLOSE_REFUSALS = {
  4008: "The call could not be opened.",
  4011: "The server failed and ended the call.",
  4013: "All slots are busy and the queue is full: try again later.",
  4401: "Not signed in, or the key was revoked: sign in and start again.",
  4429: "Too many connections: wait a minute, then start again.",
};

// Error events that mean the call was refused, with the close code that follows them. The error alone
// decides: the close frame behind it can be lost (a clean-clone CI run's page got the error, then 1006), and a
// refused caller must be told to wait, not offered a resume.
const REFUSING_ERRORS = { rate_limit_exceeded: 4429 };

/** The words for a refusal the error event announces, or null when the error does not end the call. */
export function refusalForError(code) {
  const closeCode = REFUSING_ERRORS[code];
  return closeCode ? CLOSE_REFUSALS[closeCode] : null;
}
