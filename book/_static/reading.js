// What keeps wide things readable at every width (tests/html/check_html.py checks the results).
//
// 1. Scroll cues. A display equation, a code cell or an output that is wider than its box
//    scrolls inside it. Phones (and some desktops) draw no scrollbar until one scrolls, so
//    the box's parent gets data-more="right", "left" or "both" while part of it is out of
//    view, and book/_static/course.css draws an arrow badge on that side.
// 2. Figures on a phone. A figure scaled down to a phone's column would shrink its labels
//    below 9 CSS px. minitransformer.plotting.show() stores the size of the figure's smallest
//    text (in image pixels) in the PNG ("minitransformer:smallest-text-px"); a figure is never
//    shown smaller than the width at which that text reads at MIN_TEXT_PX, and scrolls
//    sideways inside its box instead (with the cue of 1).
// 3. Equations re-broken when the column changes width (a phone turned sideways): MathJax 4
//    breaks long display equations to the width it finds when it typesets them.
(() => {
  const MIN_TEXT_PX = 9;
  const PNG_KEY = "minitransformer:smallest-text-px";
  const SCROLLERS = [
    'mjx-container[display="true"]',
    "div.highlight > pre",
    "div.cell_output pre",
    ".mt-figure-box",
  ].join(", ");

  // --- 1. scroll cues --------------------------------------------------------------------
  const cueHolder = (box) => box.parentElement;
  const update = (box) => {
    const holder = cueHolder(box);
    if (!holder) return;
    const hidden = box.scrollWidth - box.clientWidth;
    let more = "";
    if (hidden > 1) {
      const left = box.scrollLeft > 1;
      const right = box.scrollLeft < hidden - 1;
      more = left && right ? "both" : left ? "left" : right ? "right" : "";
    }
    if (more) holder.setAttribute("data-more", more);
    else holder.removeAttribute("data-more");
  };
  const watched = new WeakSet();
  const refresh = () => {
    for (const box of document.querySelectorAll(SCROLLERS)) {
      if (!watched.has(box)) {
        watched.add(box);
        box.addEventListener("scroll", () => update(box), { passive: true });
      }
      update(box);
    }
  };

  // --- 2. figures that stay readable -----------------------------------------------------
  // The tEXt chunks of a PNG: {keyword: text}.
  const pngText = (buffer) => {
    const bytes = new Uint8Array(buffer);
    const view = new DataView(buffer);
    const out = {};
    const decoder = new TextDecoder("latin1");
    for (let at = 8; at + 8 <= bytes.length; ) {
      const length = view.getUint32(at);
      const type = decoder.decode(bytes.subarray(at + 4, at + 8));
      if (type === "tEXt") {
        const data = bytes.subarray(at + 8, at + 8 + length);
        const zero = data.indexOf(0);
        out[decoder.decode(data.subarray(0, zero))] = decoder.decode(data.subarray(zero + 1));
      }
      if (type === "IDAT" || type === "IEND") break; // matplotlib writes its text first
      at += 12 + length;
    }
    return out;
  };
  const smallestText = async (img) => {
    if (!/\.png($|\?)/i.test(img.currentSrc || img.src)) return null;
    try {
      const response = await fetch(img.currentSrc || img.src);
      const value = parseFloat(pngText(await response.arrayBuffer())[PNG_KEY]);
      return value > 0 ? value : null;
    } catch (error) {
      return null;
    }
  };
  const keepReadable = async (img) => {
    if (!img.complete) await new Promise((done) => img.addEventListener("load", done, { once: true }));
    const px = await smallestText(img);
    if (!px || !img.naturalWidth) return;
    img.dataset.smallestTextPx = String(px);
    // Narrower than this and its smallest text falls below MIN_TEXT_PX.
    img.style.minWidth = `${Math.ceil((img.naturalWidth * MIN_TEXT_PX) / px)}px`;
    const box = img.parentElement;
    if (box && !box.classList.contains("mt-figure-box")) box.classList.add("mt-figure-box");
    refresh();
  };

  // --- 3. equations re-broken on a change of width ---------------------------------------
  let typesetWidth = 0;
  const rebreak = () => {
    const mj = window.MathJax;
    const column = document.querySelector("article.bd-article, main") || document.body;
    const width = column.clientWidth;
    if (!typesetWidth) typesetWidth = width;
    if (Math.abs(width - typesetWidth) < 8 || !mj || !mj.startup || !mj.startup.document) return;
    typesetWidth = width;
    const doc = mj.startup.document;
    if (typeof doc.rerenderPromise === "function") doc.rerenderPromise().then(refresh);
  };

  const start = () => {
    for (const img of document.querySelectorAll("div.cell_output img, figure img")) {
      keepReadable(img);
    }
    refresh();
    const mj = window.MathJax;
    if (mj && mj.startup && mj.startup.promise) mj.startup.promise.then(refresh);
    let timer = null;
    window.addEventListener("resize", () => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        rebreak();
        refresh();
      }, 150);
    });
    window.addEventListener("load", refresh);
    // Solutions and dropdowns that open show boxes that were not laid out before.
    document.addEventListener("click", () => setTimeout(refresh, 50));
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
