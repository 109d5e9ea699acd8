// The camera, for engines that take video: its preview, and one JPEG a second to the session while the call
// is live (input_image.append). The call holds the camera's state (call.camera: {stream, video, timer}).

import { hooks } from "./hooks.js";

/** Turn the camera on (preview, frames) or off. */
export async function toggleCamera(call) {
  if (call.camera) {
    stopCamera(call);
    return;
  }
  try {
    const stream = await navigator.mediaDevices.getUserMedia({ video: { width: 640, height: 480 } });
    const video = call.ui.cameraPreview();
    video.srcObject = stream;
    await video.play();
    const canvas = document.createElement("canvas");
    // One frame per second is what the omni engines consume; more would only queue up.
    const timer = setInterval(() => sendCameraFrame(call, video, canvas), 1000);
    call.camera = { stream, video, timer };
    call.ui.setCameraOn(true);
  } catch (err) {
    call.ui.notice(`Camera unavailable: ${err.message}`, "error");
  }
}

/** The camera off: its timer, its tracks and its preview. */
export function stopCamera(call) {
  if (!call.camera) return;
  clearInterval(call.camera.timer);
  call.camera.stream.getTracks().forEach((track) => track.stop());
  call.camera = null;
  call.ui.setCameraOn(false);
}

function sendCameraFrame(call, video, canvas) {
  if (call.state !== "live" || !video.videoWidth) return;
  canvas.width = video.videoWidth;
  canvas.height = video.videoHeight;
  canvas.getContext("2d").drawImage(video, 0, 0);
  canvas.toBlob(
    async (blob) => {
      if (!blob) return;
      const image = new Uint8Array(await blob.arrayBuffer()).toBase64();
      if (call.send({ type: "input_image.append", image })) hooks.imagesSent++;
    },
    "image/jpeg",
    0.8,
  );
}
