// "Copy" buttons: a button with data-copy puts that text on the clipboard and says it did (or how to copy by hand).

for (const button of document.querySelectorAll("button[data-copy]")) {
  const label = button.textContent;
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(button.dataset.copy);
      button.textContent = "Copied";
    } catch {
      button.textContent = "Select the text and copy it";
    }
    setTimeout(() => (button.textContent = label), 2000);
  });
}
