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
