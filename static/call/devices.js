// Microphone and speaker choice: the pickers' lists (the browser's devices) and what a failed microphone means
// in words. Device names appear once the page may use the microphone; before that they are numbered.

/** Fill `select` with the devices of `kind` ("audioinput" | "audiooutput"), keeping the current choice. */
export async function fillDevicePicker(select, kind) {
  if (!select || !navigator.mediaDevices?.enumerateDevices) return;
  const devices = (await navigator.mediaDevices.enumerateDevices()).filter(
    (d) => d.kind === kind && d.deviceId && d.deviceId !== "default",
  );
  const chosen = select.value;
  const noun = kind === "audioinput" ? "Microphone" : "Speaker";
  const options = [new Option("System default", "")];
  devices.forEach((d, i) => options.push(new Option(d.label || `${noun} ${i + 1}`, d.deviceId)));
  select.replaceChildren(...options);
  if (devices.some((d) => d.deviceId === chosen)) select.value = chosen;
}

/** Whether this browser can send the page's audio to a chosen speaker. */
export const CAN_PICK_SPEAKER = typeof AudioContext !== "undefined" && "setSinkId" in AudioContext.prototype;

/** A getUserMedia failure, said as what to do about it. */
export function microphoneProblem(err) {
  switch (err?.name) {
    case "NotAllowedError":
    case "SecurityError":
      return (
        "Parley may not use your microphone. To allow it, click the icon at the left of the address bar " +
        "(a lock or a microphone), set Microphone to Allow, then press Start call again."
      );
    case "NotFoundError":
      return "No microphone was found. Plug one in (or choose another under Microphone), then press Start call again.";
    case "NotReadableError":
      return "The microphone is in use by another program or could not be opened. Close that program, then try again.";
    case "OverconstrainedError":
      return "The chosen microphone is not available any more: choose another under Microphone.";
    default:
      return `The microphone could not be opened: ${err?.message ?? err}`;
  }
}
