// agentrl GUI env: every visible element of the page as a tree, with ids that stay stable.
// Returns {role, name, id, value, checked, disabled, focused, box, hidden, children}; text
// runs are {role: "text", name}. Ids live in a Map on window (id -> element) and a WeakMap
// (element -> id), handed out in document order on first sight; see envs/gui/tree.py.
() => {
  const W = window;
  if (!W.__agentrlIds) {
    Object.defineProperty(W, "__agentrlIds", { value: new WeakMap() });
    Object.defineProperty(W, "__agentrlEls", { value: new Map() });
    Object.defineProperty(W, "__agentrlNext", { value: { n: 1 } });
  }
  const ids = W.__agentrlIds, els = W.__agentrlEls, next = W.__agentrlNext;
  const idOf = (el) => {
    let id = ids.get(el);
    if (id === undefined) { id = next.n++; ids.set(el, id); els.set(id, el); }
    return id;
  };
  const TAGS = { A: "link", BUTTON: "button", SELECT: "combobox", TEXTAREA: "textbox",
    H1: "heading", H2: "heading", H3: "heading", H4: "heading", H5: "heading", H6: "heading",
    IMG: "img", UL: "list", OL: "list", LI: "listitem", FORM: "form", NAV: "navigation",
    MAIN: "main", TABLE: "table", TR: "row", TD: "cell", TH: "columnheader", P: "paragraph",
    OPTION: "option", LABEL: "label", DIALOG: "dialog" };
  const INPUTS = { checkbox: "checkbox", radio: "radio", button: "button", submit: "button",
    reset: "button", image: "button", search: "searchbox", range: "slider", number: "spinbutton" };
  const NAMED_BY_TEXT = new Set(["link", "button", "heading", "option", "columnheader",
    "menuitem", "tab", "clickable"]);
  const SKIP = new Set(["SCRIPT", "STYLE", "NOSCRIPT", "TEMPLATE", "HEAD", "META", "LINK"]);
  const roleOf = (el, style) => {
    const r = el.getAttribute("role");
    if (r) return r;
    // an element drawn as clickable (pointer cursor, unlike its parent) that is no control
    const up = el.parentElement;
    if (style.cursor === "pointer" && !TAGS[el.tagName] && el.tagName !== "INPUT" &&
        (!up || getComputedStyle(up).cursor !== "pointer")) return "clickable";
    if (el.tagName === "INPUT") {
      const t = (el.getAttribute("type") || "text").toLowerCase();
      return t === "hidden" ? "" : (INPUTS[t] || "textbox");
    }
    if (el.tagName === "A" && !el.hasAttribute("href")) return "";
    return TAGS[el.tagName] || "";
  };
  const text = (el) => (el.innerText !== undefined ? el.innerText : el.textContent || "").trim();
  const nameOf = (el, role) => {
    const aria = el.getAttribute("aria-label");
    if (aria) return aria;
    const by = el.getAttribute("aria-labelledby");
    if (by) return by.split(/\s+/).map((i) => { const e = document.getElementById(i); return e ? text(e) : ""; }).join(" ");
    if (el.labels && el.labels.length) return Array.from(el.labels).map(text).join(" ");
    if (el.getAttribute("alt")) return el.getAttribute("alt");
    if (role === "button" && el.tagName === "INPUT") return el.value || "";
    if (NAMED_BY_TEXT.has(role)) return text(el);
    return el.getAttribute("title") || el.getAttribute("placeholder") || "";
  };
  const walk = (el) => {
    const style = getComputedStyle(el);
    if (style.display === "none" || style.visibility === "hidden" || el.getAttribute("aria-hidden") === "true") {
      return { role: "", hidden: true, children: [] };
    }
    const role = roleOf(el, style);
    const r = el.getBoundingClientRect();
    const node = { role, children: [] };
    if (role === "label" && el.control) node.labels = true;  // its control carries its text
    if (role) {
      node.id = idOf(el);
      node.name = nameOf(el, role);
      node.box = [r.x, r.y, r.width, r.height];  // viewport CSS pixels, as in the screenshot
      if (r.width === 0 && r.height === 0 && role !== "option") node.hidden = true;
      if (el.tagName === "INPUT" || el.tagName === "TEXTAREA") {
        if (role === "checkbox" || role === "radio") node.checked = el.checked;
        else if (role !== "button") node.value = el.value;
      }
      if (el.tagName === "SELECT") {
        const o = el.options[el.selectedIndex];
        node.value = o ? o.text : "";
        return Object.assign(node, { disabled: el.disabled, focused: document.activeElement === el });
      }
      node.disabled = !!el.disabled;
      node.focused = document.activeElement === el;
    }
    for (const c of el.childNodes) {
      if (c.nodeType === 3) {
        const t = c.textContent.trim();
        if (t) node.children.push({ role: "text", name: t, children: [] });
      } else if (c.nodeType === 1 && !SKIP.has(c.tagName)) {
        node.children.push(walk(c));
      }
    }
    return node;
  };
  return document.body ? walk(document.body) : { role: "", children: [] };
}
