// Make the navigation buttons work on narrow screens (and the sidebar toggle on wide ones).
//
// sphinx-book-theme 1.3.0 draws its own ☰ (site navigation) and contents buttons in the
// article header. The code that opens the sidebars binds to document.querySelector(
// ".primary-toggle") and (".secondary-toggle"): pydata-sphinx-theme 0.17's
// setupMobileSidebarKeyboardHandlers (the dialogs below 992 px) and sphinx-book-theme's
// fixSidebarToggle (collapsing the sidebar above). The first such button in the page is
// pydata-sphinx-theme's copy in the page header, which sphinx-book-theme hides, so the buttons a
// reader sees have no handler and do nothing. Each visible button hands its click to the
// bound one, which then does what the theme meant at the current width.
(() => {
  const forward = () => {
    for (const kind of ["primary", "secondary"]) {
      const bound = document.querySelector(`.${kind}-toggle`);
      for (const button of document.querySelectorAll(`.${kind}-toggle`)) {
        if (button === bound) continue;
        button.addEventListener("click", (event) => {
          event.preventDefault();
          event.stopPropagation();
          button.blur(); // hide the button's tooltip, which would otherwise stay on screen
          bound.click();
        });
      }
    }
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", forward);
  else forward();
})();

// On a narrow screen the site navigation and the page's contents open as modal dialogs, which
// pydata-sphinx-theme closes only on Escape or a tap on the backdrop: after a reader taps a
// section, the contents stay open over three quarters of the screen. A tap on a link inside
// either dialog closes it first. A link to this page then scrolls to its target after the
// dialog has closed (closing puts the focus back on the button that opened it, which would
// otherwise scroll the page back to the top); a link to another page just loads it.
(() => {
  const DIALOGS = "#pst-primary-sidebar-modal, #pst-secondary-sidebar-modal";
  document.addEventListener("click", (event) => {
    const link = event.target.closest("a[href]");
    const dialog = link && link.closest(DIALOGS);
    if (!dialog || !dialog.open) return;
    const url = new URL(link.href, location.href);
    const samePage = url.origin === location.origin && url.pathname === location.pathname;
    if (!samePage || !url.hash) {
      dialog.close();
      return;
    }
    event.preventDefault();
    dialog.close();
    if (location.hash === url.hash) {
      document.getElementById(decodeURIComponent(url.hash.slice(1)))?.scrollIntoView();
    } else {
      location.hash = url.hash;
    }
  });
})();
