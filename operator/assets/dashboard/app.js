// Kortex dashboard: a dependency-free single page over the Kortex HTTP API (served by the
// binary itself; no request leaves this origin). Text is only ever inserted as text nodes.
'use strict';
(() => {
  const main = document.getElementById('main');
  const who = document.getElementById('who');
  const view = { cleanup: [] };
  let me = null;

  // ---- helpers -------------------------------------------------------------------------
  function h(tag, attrs, ...children) {
    const el = tag.startsWith('svg:')
      ? document.createElementNS('http://www.w3.org/2000/svg', tag.slice(4))
      : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (k === 'class') el.setAttribute('class', v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  // ---- Markdown ------------------------------------------------------------------------
  // Model answers are Markdown. They are rendered into DOM nodes, never HTML strings: raw
  // HTML in an answer stays text, links open only http, https and mailto (rel=noopener
  // noreferrer), code is highlighted here (YAML, JSON, shell) with no outside library.
  const SAFE_URL = /^(https?:\/\/|mailto:)/i;
  const INLINE = [
    ['code', /`([^`\n]+)`/],
    ['link', /\[([^\]\n]+)\]\(([^)\s]+)\)/],
    ['auto', /<((?:https?:\/\/|mailto:)[^>\s]+)>/],
    ['url', /\bhttps?:\/\/[^\s<>()]*[^\s<>().,;:!?'"]/],
    ['strong', /\*\*([^*\n]+)\*\*|__([^_\n]+)__/],
    ['del', /~~([^~\n]+)~~/],
    ['em', /\*([^*\s][^*\n]*)\*|(?<![\w])_([^_\s][^_\n]*)_(?![\w])/],
  ];

  function link(text, url) {
    if (!SAFE_URL.test(url)) return document.createTextNode(text === url ? url : `${text} (${url})`);
    return h('a', { href: url, rel: 'noopener noreferrer', target: '_blank' }, text);
  }

  function inline(text) {
    const out = [];
    let rest = text;
    while (rest) {
      let best = null;
      for (const [kind, re] of INLINE) {
        const m = re.exec(rest);
        if (m && (!best || m.index < best.m.index)) best = { kind, m };
      }
      if (!best) { out.push(rest); break; }
      const { kind, m } = best;
      if (m.index > 0) out.push(rest.slice(0, m.index));
      if (kind === 'code') out.push(h('code', {}, m[1]));
      else if (kind === 'link') out.push(link(m[1], m[2]));
      else if (kind === 'auto') out.push(link(m[1], m[1]));
      else if (kind === 'url') out.push(link(m[0], m[0]));
      else out.push(h(kind, {}, inline(m[1] || m[2])));
      rest = rest.slice(m.index + m[0].length);
    }
    return out;
  }

  function withBreaks(lines) {
    const out = [];
    lines.forEach((l, i) => { if (i) out.push(h('br')); out.push(inline(l)); });
    return out;
  }

  const TOKENS = {
    yaml: [['com', /#.*$/], ['key', /^(\s*-?\s*)([\w.\/-]+)(?=:(\s|$))/], ['str', /"(?:[^"\\]|\\.)*"|'[^']*'/], ['num', /\b-?\d+(\.\d+)?\b/], ['kw', /\b(true|false|null)\b/]],
    json: [['key', /"(?:[^"\\]|\\.)*"(?=\s*:)/], ['str', /"(?:[^"\\]|\\.)*"/], ['num', /-?\b\d+(\.\d+)?([eE][+-]?\d+)?\b/], ['kw', /\b(true|false|null)\b/]],
    sh: [['com', /(^|\s)#.*$/], ['str', /"(?:[^"\\]|\\.)*"|'[^']*'/], ['kw', /^(\s*)(kubectl|helm|curl|kortex|export|sudo|cd|cat|grep|jq)\b/], ['var', /\$\{?\w+\}?/], ['flag', /(?<=\s)--?[\w-]+/]],
  };
  const LANGS = { yaml: 'yaml', yml: 'yaml', json: 'json', sh: 'sh', bash: 'sh', shell: 'sh', console: 'sh', zsh: 'sh' };

  function highlight(code, lang) {
    const rules = TOKENS[LANGS[(lang || '').toLowerCase()]];
    if (!rules) return [code];
    const out = [];
    code.split('\n').forEach((line, n) => {
      if (n) out.push('\n');
      let rest = line;
      while (rest) {
        let best = null;
        for (const [cls, re] of rules) {
          const m = re.exec(rest);
          if (m && m[0] && (!best || m.index < best.m.index)) best = { cls, m };
        }
        if (!best) { out.push(rest); break; }
        const { cls, m } = best;
        // Rules with a leading context group keep it as plain text.
        const lead = m.length > 2 && m[1] && m[0].startsWith(m[1]) && cls !== 'str' ? m[1] : '';
        if (m.index + lead.length > 0) out.push(rest.slice(0, m.index + lead.length));
        out.push(h('span', { class: `tok-${cls}` }, m[0].slice(lead.length)));
        rest = rest.slice(m.index + m[0].length);
      }
    });
    return out;
  }

  /** A button that copies `text`, and says so. */
  function copyButton(text, label) {
    const copy = h('button', { type: 'button', class: 'copy', 'aria-label': label }, 'Copy');
    copy.addEventListener('click', async () => {
      try { await navigator.clipboard.writeText(text); copy.textContent = 'Copied'; } catch (_) { copy.textContent = 'Select and copy'; }
      setTimeout(() => { copy.textContent = 'Copy'; }, 1500);
    });
    return copy;
  }

  function codeBlock(code, lang) {
    const copy = copyButton(code, `Copy ${lang || 'code'}`);
    return h('div', { class: 'code' },
      h('div', { class: 'code-head' }, h('span', {}, lang || 'text'), copy),
      h('pre', {}, h('code', { class: lang ? `lang-${lang.toLowerCase()}` : null }, highlight(code, lang))));
  }

  const LIST_ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
  const cells = (line) => line.trim().replace(/^\|/, '').replace(/\|$/, '').split('|').map((c) => c.trim());

  function list(lines, i) {
    const first = LIST_ITEM.exec(lines[i]);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const el = h(ordered ? 'ol' : 'ul', ordered && parseInt(first[2], 10) !== 1 ? { start: parseInt(first[2], 10) } : {});
    while (i < lines.length) {
      const m = LIST_ITEM.exec(lines[i]);
      if (!m || m[1].length < indent || (m[1].length === indent && /\d/.test(m[2]) !== ordered)) break;
      if (m[1].length > indent) { // a nested list belongs to the item before
        const [nested, next] = list(lines, i);
        (el.lastElementChild || el).append(nested);
        i = next;
        continue;
      }
      const text = [m[3]];
      i += 1;
      while (i < lines.length && lines[i].trim() && !LIST_ITEM.test(lines[i]) && /^\s+/.test(lines[i])) text.push(lines[i].trim()), i += 1;
      el.append(h('li', {}, withBreaks(text)));
      if (i < lines.length && !lines[i].trim() && i + 1 < lines.length && LIST_ITEM.test(lines[i + 1])) i += 1;
    }
    return [el, i];
  }

  function markdown(src) {
    const lines = String(src).replace(/\r\n?/g, '\n').split('\n');
    return blocks(lines);
  }

  function blocks(lines) {
    const frag = document.createDocumentFragment();
    let i = 0;
    const starts = (l, next) => /^\s*(```|~~~)/.test(l) || /^#{1,6}\s/.test(l) || LIST_ITEM.test(l) || /^\s*>/.test(l)
      || (l.includes('|') && next !== undefined && TABLE_RULE.test(next) && next.includes('-'));
    while (i < lines.length) {
      const line = lines[i];
      const fence = /^\s*(```|~~~)\s*([\w+-]*)/.exec(line);
      if (fence) {
        const code = [];
        i += 1;
        while (i < lines.length && !lines[i].trim().startsWith(fence[1])) code.push(lines[i]), i += 1;
        i += 1;
        frag.append(codeBlock(code.join('\n'), fence[2]));
        continue;
      }
      const head = /^(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line);
      if (head) {
        frag.append(h(`h${Math.min(6, head[1].length + 2)}`, { class: 'md-h' }, inline(head[2])));
        i += 1;
        continue;
      }
      if (line.includes('|') && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1]) && lines[i + 1].includes('-')) {
        const header = cells(line);
        const aligns = cells(lines[i + 1]).map((c) => (c.startsWith(':') && c.endsWith(':') ? 'center' : c.endsWith(':') ? 'right' : null));
        i += 2;
        const rows = [];
        while (i < lines.length && lines[i].includes('|') && lines[i].trim()) rows.push(cells(lines[i])), i += 1;
        const align = (k) => (aligns[k] ? { class: `al-${aligns[k]}` } : {});
        frag.append(h('div', { class: 'table-wrap' }, h('table', {},
          h('thead', {}, h('tr', {}, header.map((c, k) => h('th', { scope: 'col', ...align(k) }, inline(c))))),
          h('tbody', {}, rows.map((r) => h('tr', {}, header.map((_, k) => h('td', align(k), inline(r[k] || '')))))))));
        continue;
      }
      if (LIST_ITEM.test(line)) {
        const [el, next] = list(lines, i);
        frag.append(el);
        i = next;
        continue;
      }
      if (/^\s*>/.test(line)) {
        const quoted = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) quoted.push(lines[i].replace(/^\s*>\s?/, '')), i += 1;
        frag.append(h('blockquote', {}, blocks(quoted)));
        continue;
      }
      if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
        frag.append(h('hr'));
        i += 1;
        continue;
      }
      if (!line.trim()) { i += 1; continue; }
      const para = [];
      while (i < lines.length && lines[i].trim() && !(para.length && starts(lines[i], lines[i + 1]))) para.push(lines[i]), i += 1;
      frag.append(h('p', {}, withBreaks(para)));
    }
    return frag;
  }

  /** A shell command with a copy button. */
  function commandLine(command, what) {
    return h('div', { class: 'command' }, h('code', {}, highlight(command, 'sh')), copyButton(command, `Copy the ${what}`));
  }

  /** A tool result: JSON indented and highlighted, anything else as the tool wrote it. */
  function toolResult(content) {
    const text = String(content || '');
    if (/^\s*[[{]/.test(text)) {
      try {
        return highlight(JSON.stringify(JSON.parse(text), null, 2), 'json');
      } catch (_) { /* not JSON after all */ }
    }
    return [text];
  }

  /** An assistant message's element with `text` rendered; `el` is re-rendered in place. */
  function answer(text, attrs, el) {
    const target = el || h('div', attrs);
    target.classList.add('md');
    target.replaceChildren(markdown(text));
    return target;
  }

  /** Under an answer: when, and the provider and model that wrote it. */
  function byline(iso, provider, model) {
    const parts = [];
    const when = ago(iso);
    if (when) parts.push(when);
    if (provider || model) {
      if (parts.length) parts.push(' · ');
      parts.push(h('span', { class: 'served-by', title: `provider ${provider || '?'}, model ${model || '?'}` },
        [provider, model].filter(Boolean).join(' · ')));
    }
    return parts.length ? h('div', { class: 'when' }, ...parts) : null;
  }

  let reauthenticating = false;

  function csrf() {
    const m = document.cookie.match(/(?:^|;\s*)(?:__Host-)?kortex_csrf=([^;]+)/);
    return m ? decodeURIComponent(m[1]) : null;
  }

  async function api(method, path, body) {
    const headers = { accept: 'application/json' };
    if (body !== undefined) headers['content-type'] = 'application/json';
    if (method !== 'GET') {
      const token = csrf();
      if (token) headers['x-csrf-token'] = token;
    }
    const r = await fetch(path, {
      method,
      headers,
      credentials: 'same-origin',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (r.status === 204) return null;
    let data = null;
    try { data = await r.json(); } catch (_) { data = null; }
    if (!r.ok) {
      const e = new Error((data && data.error && data.error.message) || `HTTP ${r.status}`);
      e.status = r.status;
      e.code = data && data.error && data.error.code;
      // Single sign-on whose ID token the provider does not renew on refresh: sign in
      // again at the provider, silently while its own session lasts (docs/sso.md).
      if (e.code === 'reauthenticate' && !reauthenticating) {
        reauthenticating = true;
        location.assign(`/auth/v1/oidc/login?prompt=none&return=${encodeURIComponent(`/${location.hash}`)}`);
      }
      throw e;
    }
    return data;
  }

  function seconds(ms) {
    if (ms < 1000) return `${ms} ms`;
    return `${(ms / 1000).toFixed(ms < 10000 ? 1 : 0)} s`;
  }

  /** `iso` as "3 min ago" (or a date when older than a week), the exact time on hover. */
  function ago(iso) {
    const t = Date.parse(iso);
    if (!Number.isFinite(t)) return null;
    const s = Math.max(0, Math.round((Date.now() - t) / 1000));
    const text = s < 45 ? 'just now' : s < 3600 ? `${Math.round(s / 60)} min ago` : s < 86400 ? `${Math.round(s / 3600)} h ago`
      : s < 7 * 86400 ? `${Math.round(s / 86400)} d ago` : new Date(t).toISOString().slice(0, 10);
    return h('time', { datetime: iso, title: new Date(t).toLocaleString(undefined, { dateStyle: 'full', timeStyle: 'long' }) }, text);
  }

  function until(iso) {
    const left = Math.round((Date.parse(iso) - Date.now()) / 1000);
    if (!Number.isFinite(left)) return '';
    if (left <= 0) return 'expired';
    const m = Math.floor(left / 60);
    const s = left % 60;
    return m > 0 ? `in ${m}m ${String(s).padStart(2, '0')}s` : `in ${s}s`;
  }

  function usd(v) {
    const n = Number(v || 0);
    return n > 0 && n < 0.01 ? '<$0.01' : `$${n.toFixed(2)}`;
  }

  function errorBox(e) {
    return h('div', { class: 'error-box', role: 'alert' }, e.message || String(e));
  }

  function condition(item, type) {
    return (item.conditions || []).find((c) => c.type === type);
  }

  function leave() {
    for (const f of view.cleanup.splice(0)) {
      try { f(); } catch (_) { /* nothing to undo */ }
    }
  }

  function show(...children) {
    leave();
    main.replaceChildren(...children);
  }

  // ---- sign-in -------------------------------------------------------------------------
  // With single sign-on, "Sign in with <provider>" (docs/sso.md); a token or key may still be
  // pasted (bots, break-glass). Why the last sign-in failed comes from the server.
  async function signIn(message) {
    who.replaceChildren();
    let options = { oidc: null, token: true, error: null };
    try { options = await api('GET', '/auth/v1/sign-in'); } catch (_) { /* the token form still works */ }
    const why = options.error || message;
    const status = h('div', { 'aria-live': 'polite' });
    if (why) status.append(errorBox({ message: why }));
    const token = h('textarea', { id: 'token', name: 'token', required: true, autocomplete: 'off', spellcheck: 'false' });
    const form = h('form', { class: options.oidc ? 'token-form' : '' },
      h('p', { class: 'muted' },
        'Paste a Kubernetes token (for example from ', h('code', {}, 'kubectl create token'),
        ' or your OIDC login) or a Kortex API key. It is kept in an HttpOnly cookie of this browser only.'),
      h('label', { for: 'token' }, 'Token or API key'),
      token,
      h('p', {}, h('button', { class: options.oidc ? '' : 'primary', type: 'submit' }, options.oidc ? 'Sign in with the token' : 'Sign in')));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      status.replaceChildren();
      try {
        await api('POST', '/auth/v1/login', { token: token.value.trim() });
        await boot();
      } catch (e) {
        status.append(errorBox(e));
      }
    });
    const panel = h('section', { class: 'panel signin', 'aria-labelledby': 'signin-title' },
      h('h2', { id: 'signin-title' }, 'Sign in to Kortex'), status);
    if (options.oidc) {
      const back = `/${location.hash}`;
      const sso = h('a', { class: 'button primary', id: 'sso-sign-in', href: `${options.oidc.loginUrl}?return=${encodeURIComponent(back)}` },
        `Sign in with ${options.oidc.name}`);
      panel.append(h('p', {}, sso));
      if (options.token) panel.append(h('details', {}, h('summary', {}, 'Use a token or API key instead'), form));
      show(panel);
      sso.focus();
    } else {
      panel.append(form);
      show(panel);
      token.focus();
    }
  }

  function renderWho() {
    const groups = (me.groups || []).length ? ` (${me.groups.join(', ')})` : '';
    const out = h('button', { type: 'button', id: 'signout' }, 'Sign out');
    out.addEventListener('click', async () => {
      const done = await api('POST', '/auth/v1/logout').catch(() => null);
      me = null;
      // Single sign-on: end the session at the provider too, which sends the browser back.
      if (done && done.endSessionUrl) { location.assign(done.endSessionUrl); return; }
      signIn('You are signed out.');
    });
    const parts = [h('span', { id: 'user', title: `signed in as ${me.user}${groups}` }, `${me.user}${groups}`)];
    // Nothing to sign out of on loopback or behind an authenticating proxy.
    if (me.mode !== 'loopback' && !me.proxy) parts.push(out);
    who.replaceChildren(...parts);
  }

  // ---- proposals -----------------------------------------------------------------------
  // A change delivered through Git (docs/gitops.md): who applies the target, the file and
  // field, the unified diff a person approves (added and removed lines marked, not only
  // coloured), and once pushed the change request with its state.
  function gitPreview(preview, git) {
    const out = [];
    for (const w of preview.warnings || []) out.push(h('p', { class: 'callout warn', role: 'note' }, `⚠ ${w}`));
    const owner = preview.owner ? `${preview.owner.kind} ${preview.owner.namespace}/${preview.owner.name}` : (preview.tool || '');
    const rows = [['Applied by', owner], ['Repository', preview.repository || ((preview.sources || [])[0] || {}).repoURL || '—']];
    if (preview.path) rows.push(['File', `${preview.path} (${preview.baseBranch} at ${String(preview.baseCommit || '').slice(0, 12)})`]);
    if (preview.field) rows.push(['Field', preview.field]);
    if (preview.introducedBy) rows.push(['Introduced by', `${String(preview.introducedBy.commit || '').slice(0, 12)} ${preview.introducedBy.subject || ''}`]);
    out.push(h('dl', { class: 'git' }, rows.map(([k, v]) => [h('dt', {}, k), h('dd', {}, String(v))])));
    if (preview.error) out.push(h('p', { class: 'callout warn', role: 'note' }, preview.error));
    if (preview.diff) {
      const lines = String(preview.diff).split('\n').map((l) => {
        const kind = l.startsWith('+++') || l.startsWith('---') || l.startsWith('diff ') ? 'meta'
          : l.startsWith('+') ? 'add' : l.startsWith('-') ? 'del' : l.startsWith('@@') ? 'hunk' : 'ctx';
        const label = kind === 'add' ? h('span', { class: 'sr-only' }, 'added: ') : kind === 'del' ? h('span', { class: 'sr-only' }, 'removed: ') : null;
        return h('span', { class: `line ${kind}` }, label, l);
      });
      out.push(h('pre', { class: 'gitdiff', 'aria-label': 'The Git change to approve (unified diff)' }, lines));
    }
    if (git) {
      const where = git.requestUrl
        ? h('a', { href: git.requestUrl, target: '_blank', rel: 'noopener noreferrer', class: 'request' }, git.requestUrl)
        : h('code', {}, git.branch);
      out.push(h('p', { class: 'request-state', 'data-state': git.requestState }, 'Change request: ', where, ` — ${git.requestState}`,
        git.mergeCommit ? ` (merged as ${String(git.mergeCommit).slice(0, 12)})` : ''));
    }
    return out;
  }

  function proposalCard(p, onChange) {
    const card = h('article', { class: 'card proposal', 'data-proposal': p.id, 'aria-label': `Proposal ${p.name}`, tabindex: 0 });
    const fill = (p) => {
      const spec = p.spec || {};
      const status = p.status || {};
      const phase = status.phase || 'Pending';
      const t = spec.target && typeof spec.target === 'object' ? spec.target : null;
      const target = t ? `${t.kind || ''}/${t.name || ''}` : String(spec.target || '');
      const expires = h('dd', { class: 'expires' }, phase === 'Pending' ? until(status.expiresAt) : (status.expiresAt || ''));
      const rows = [
        ['Action', spec.delivery === 'git' ? `${spec.action} (as a Git change)` : spec.action],
        ['Target', t ? `${t.kind} ${t.namespace || p.namespace}/${t.name}` : `${p.namespace}/${target}`],
        ['Why', spec.rationale],
        ['Blast radius', spec.blastRadius || '—'],
        ['Reversible', spec.reversible === true ? 'yes' : spec.reversible === false ? 'no' : '—'],
        ['Proposed by', `${(spec.session || {}).user || ''} in session ${(spec.session || {}).name || ''}`],
      ];
      // The pinned Git change is shown as its diff below, not as raw parameters.
      const params = spec.params ? Object.fromEntries(Object.entries(spec.params).filter(([k]) => k !== 'git')) : {};
      if (Object.keys(params).length) rows.push(['Parameters', JSON.stringify(params)]);
      if (spec.decision && spec.decision.by) rows.push(['Decided by', `${spec.decision.by}${spec.decision.reason ? `: ${spec.decision.reason}` : ''}`]);
      if (status.message) rows.push(['Result', status.message]);
      const dl = h('dl', {}, rows.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v === undefined || v === null ? '' : String(v))]),
        h('dt', {}, phase === 'Pending' ? 'Expires' : 'Deadline was'), expires);
      const parts = [
        h('h3', {}, `${spec.action} ${target}`, h('span', { class: `phase ${phase}`, 'data-phase': phase }, phase)),
        dl,
      ];
      const preview = status.preview;
      if (preview && typeof preview === 'object' && preview.delivery === 'git') {
        parts.push(...gitPreview(preview, status.git));
      } else if (preview && typeof preview === 'object' && preview.before && preview.after) {
        // The dry run as a before/after table, the fields that change marked; the
        // warnings (an autoscaler or a GitOps tool owns the target) as callouts.
        for (const w of preview.warnings || []) parts.push(h('p', { class: 'callout warn', role: 'note' }, `⚠ ${w}`));
        const keys = [...new Set([...Object.keys(preview.before), ...Object.keys(preview.after)])];
        const fmt = (v) => (v === undefined || v === null ? '—' : typeof v === 'object' ? JSON.stringify(v) : String(v));
        parts.push(h('table', { class: 'diff', 'aria-label': 'Dry-run preview: before and after' },
          h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'field'), h('th', { scope: 'col' }, 'now'), h('th', { scope: 'col' }, 'after'))),
          h('tbody', {}, keys.map((k) => {
            const before = fmt(preview.before[k]);
            const after = fmt(preview.after[k]);
            const changed = before !== after;
            return h('tr', { class: changed ? 'changed' : null, 'data-field': k },
              h('th', { scope: 'row' }, k), h('td', {}, before), h('td', {}, changed ? h('strong', {}, after) : after, changed ? h('span', { class: 'sr-only' }, ' (changes)') : null));
          }))));
      } else if (preview !== undefined && preview !== null) {
        parts.push(h('details', {}, h('summary', {}, 'Dry-run preview'),
          h('pre', {}, typeof preview === 'string' ? preview : (preview.note || preview.error || JSON.stringify(preview, null, 2)))));
      }
      // The same decision from a terminal, to copy; the undo of an executed proposal. In a
      // cluster it is an ActionProposal (kubectl); `kortex serve` keeps it in its database.
      const inCluster = Boolean(me && me.actionProposals);
      const kubectl = (verb) => `kubectl kortex ${verb} ${p.name} -n ${p.namespace}`;
      if (phase === 'Pending') parts.push(commandLine(inCluster ? kubectl('approve') : `kortex proposals approve ${p.id}`, 'approve command'));
      if (phase === 'Succeeded' && status.undo) parts.push(h('p', { class: 'muted' }, 'Undo: '), commandLine(inCluster ? kubectl('undo') : `kortex proposals undo ${p.id}`, 'undo command'));
      if (phase === 'Pending') {
        const reason = h('input', { type: 'text', placeholder: 'Reason (optional)', 'aria-label': `Reason for deciding ${p.name}` });
        const result = h('div', { 'aria-live': 'polite' });
        const decide = (verb) => async () => {
          result.replaceChildren();
          buttons.forEach((b) => { b.disabled = true; });
          try {
            const body = reason.value.trim() ? { reason: reason.value.trim() } : {};
            await api('POST', `/chat/v1/proposals/${encodeURIComponent(p.id)}/${verb}`, body);
            const fresh = await findProposal(p.id);
            if (fresh) fill(fresh);
            if (onChange) onChange();
          } catch (e) {
            result.append(errorBox(e));
            buttons.forEach((b) => { b.disabled = false; });
          }
        };
        const buttons = [
          h('button', { class: 'primary', type: 'button', 'data-decide': 'approve', onclick: decide('approve') }, 'Confirm'),
          h('button', { class: 'danger', type: 'button', 'data-decide': 'reject', onclick: decide('reject') }, 'Reject'),
        ];
        parts.push(h('div', { class: 'actions' }, reason, buttons), result);
        const tick = setInterval(() => { expires.textContent = until(status.expiresAt); }, 1000);
        view.cleanup.push(() => clearInterval(tick));
      }
      card.replaceChildren(...parts);
      card.dataset.phase = phase;
    };
    fill(p);
    card.refill = fill;
    return card;
  }

  async function findProposal(id) {
    const list = await api('GET', '/chat/v1/proposals');
    return (list.items || []).find((p) => p.id === id) || null;
  }

  async function proposalsView() {
    const filter = h('select', { 'aria-label': 'Phase' },
      ['', 'Pending', 'Approved', 'Executing', 'Succeeded', 'Failed', 'Rejected', 'Expired']
        .map((p) => h('option', { value: p }, p || 'All phases')));
    const list = h('div', { class: 'cards', 'aria-live': 'polite' });
    const load = async () => {
      try {
        const q = filter.value ? `?phase=${encodeURIComponent(filter.value)}` : '';
        const data = await api('GET', `/chat/v1/proposals${q}`);
        const items = data.items || [];
        // Keep cards being edited; replace the others.
        const open = document.activeElement && list.contains(document.activeElement);
        if (open) return;
        list.replaceChildren(...(items.length ? items.map((p) => proposalCard(p, load)) : [h('p', { class: 'muted' }, 'No proposals.')]));
      } catch (e) {
        list.replaceChildren(errorBox(e));
      }
    };
    filter.addEventListener('change', load);
    show(h('section', { class: 'grid' },
      h('div', { class: 'conv-head' }, h('h2', {}, 'Proposals'), filter,
        h('span', { class: 'muted' }, 'Actions the model proposed. Nothing runs until a person confirms it.')),
      list));
    await load();
    const every = setInterval(load, 4000);
    view.cleanup.push(() => clearInterval(every));
  }

  // ---- chat ----------------------------------------------------------------------------
  // Session states as the list and its filter name them.
  const STATES = { idle: 'idle', running: 'running', requires_action: 'waiting', paused: 'paused', failed: 'failed' };

  async function chatView(id) {
    const listEl = h('ul', { 'aria-label': 'Sessions' });
    const name = h('input', { id: 'new-session-name', name: 'name', required: true, placeholder: 'e.g. incident-checkout', autocomplete: 'off' });
    const ns = h('input', { id: 'new-session-namespace', name: 'namespace', placeholder: 'default', autocomplete: 'off' });
    const createMsg = h('div', { 'aria-live': 'polite' });
    const form = h('form', { class: 'new-session' },
      h('label', { for: 'new-session-name' }, 'New session'), name,
      h('label', { for: 'new-session-namespace', class: 'muted' }, 'Namespace (optional)'), ns,
      h('button', { class: 'primary', type: 'submit' }, 'Create session'), createMsg);
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      createMsg.replaceChildren();
      try {
        const body = { name: name.value.trim() };
        if (ns.value.trim()) body.namespace = ns.value.trim();
        const s = await api('POST', '/chat/v1/sessions', body);
        name.value = '';
        location.hash = `#/chat/${s.id}`;
      } catch (e) {
        createMsg.append(errorBox(e));
      }
    });
    const conversation = h('section', { class: 'panel conversation', 'aria-label': 'Conversation' });
    const sharedEl = h('ul', { 'aria-label': 'Shared with me', id: 'shared-sessions' });
    const triggeredEl = h('ul', { 'aria-label': 'Triggered', id: 'triggered-sessions' });
    // Search (name, title and text, on the server) and filters (policy, state, here).
    const search = h('input', { id: 'session-search', type: 'search', placeholder: 'Search name, title, text', 'aria-label': 'Search sessions', autocomplete: 'off', value: view.sessionSearch || '' });
    const policyFilter = h('select', { id: 'session-policy', 'aria-label': 'Filter by policy' }, h('option', { value: '' }, 'any policy'));
    const stateFilter = h('select', { id: 'session-state', 'aria-label': 'Filter by state' },
      h('option', { value: '' }, 'any state'),
      Object.entries(STATES).map(([v, t]) => h('option', { value: v }, t)));
    const filters = h('div', { class: 'session-filters' }, search, h('div', { class: 'session-selects' }, policyFilter, stateFilter));
    // No session open: over both columns, whether any model can answer (a first run's first
    // screen says so before anyone creates a session).
    const landingBanner = h('div', { class: 'route-banner', id: 'route-banner', role: 'alert', hidden: true });
    show(...(id ? [] : [landingBanner]), h('div', { class: 'chat' },
      h('aside', { class: 'panel sessions', 'aria-label': 'Sessions' }, form, filters, listEl,
        h('h3', { class: 'shared-head' }, 'Shared with me'), sharedEl,
        h('h3', { class: 'shared-head' }, 'Triggered'), triggeredEl),
      conversation));
    const loadShared = async () => {
      try {
        const data = await api('GET', '/chat/v1/sessions?shared=true');
        const items = data.items || [];
        sharedEl.replaceChildren(...items.map((s) => h('li', { class: s.id === id ? 'current' : '', 'data-session': s.id },
          h('a', { href: `#/chat/${s.id}`, 'aria-current': s.id === id ? 'page' : null },
            s.name, h('span', { class: 't' }, `${s.user} · ${s.access === 'continue' ? 'you may continue' : 'read only'}${s.title ? ` · ${s.title}` : ''}`)))));
        if (!items.length) sharedEl.append(h('li', { class: 'muted' }, 'Nothing shared with you.'));
      } catch (e) {
        sharedEl.replaceChildren(errorBox(e));
      }
    };
    // Investigations alerts and schedules started, under policies the caller may use.
    const loadTriggered = async () => {
      try {
        const data = await api('GET', '/chat/v1/sessions?triggered=true');
        const items = data.items || [];
        triggeredEl.replaceChildren(...items.map((s) => h('li', { class: s.id === id ? 'current' : '', 'data-session': s.id },
          h('a', { href: `#/chat/${s.id}`, 'aria-current': s.id === id ? 'page' : null },
            s.name,
            s.title ? h('span', { class: 'summary', title: s.title }, s.title) : null,
            h('span', { class: 't' }, `⚡ ${s.trigger ? s.trigger.name : ''} · ${STATES[s.status] || s.status} · `, ago(s.updatedAt))))));
        if (!items.length) triggeredEl.append(h('li', { class: 'muted' }, 'No triggered investigations.'));
      } catch (e) {
        triggeredEl.replaceChildren(errorBox(e));
      }
    };
    const loadSessions = async () => {
      loadShared();
      loadTriggered();
      try {
        const q = search.value.trim();
        view.sessionSearch = q;
        const data = await api('GET', `/chat/v1/sessions${q ? `?q=${encodeURIComponent(q)}` : ''}`);
        const all = data.items || [];
        const policies = [...new Set(all.map((s) => s.policy).filter(Boolean))].sort();
        const chosen = policyFilter.value;
        policyFilter.replaceChildren(h('option', { value: '' }, 'any policy'),
          ...policies.map((p) => h('option', { value: p, selected: p === chosen }, p)));
        const shown = all.filter((s) => (!policyFilter.value || s.policy === policyFilter.value)
          && (!stateFilter.value || s.status === stateFilter.value));
        listEl.replaceChildren(...shown.map((s) => {
          const rename = h('button', { type: 'button', class: 'rename', 'aria-label': `Rename session ${s.name}` }, '✎');
          rename.addEventListener('click', async () => {
            const title = prompt(`New title for ${s.name}`, s.title || s.name);
            if (title === null || !title.trim()) return;
            try {
              await api('PATCH', `/chat/v1/sessions/${encodeURIComponent(s.id)}`, { title: title.trim() });
              loadSessions();
            } catch (e) { alert(e.message); }
          });
          const del = h('button', { type: 'button', class: 'danger', 'aria-label': `Delete session ${s.name}` }, '✕');
          del.addEventListener('click', async () => {
            if (!confirm(`Delete session ${s.name}? The audit log keeps its records.`)) return;
            try {
              await api('DELETE', `/chat/v1/sessions/${encodeURIComponent(s.id)}`);
              if (s.id === id) location.hash = '#/chat'; else loadSessions();
            } catch (e) { alert(e.message); }
          });
          return h('li', { class: s.id === id ? 'current' : '' },
            h('a', { href: `#/chat/${s.id}`, 'aria-current': s.id === id ? 'page' : null },
              s.name,
              // The title: the incident summary a summarize model wrote, or the owner's.
              s.title ? h('span', { class: 'summary', title: s.title }, s.title) : null,
              h('span', { class: 't' }, `${s.policy || 'no policy'} · ${STATES[s.status] || s.status} · `, ago(s.updatedAt))),
            rename, del);
        }));
        if (!shown.length) listEl.append(h('li', { class: 'muted' }, all.length || q ? 'No sessions match.' : 'No sessions yet.'));
      } catch (e) {
        listEl.replaceChildren(errorBox(e));
      }
    };
    view.refreshSessions = loadSessions;
    let searchTimer = null;
    search.addEventListener('input', () => {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(loadSessions, 250);
    });
    view.cleanup.push(() => clearTimeout(searchTimer));
    policyFilter.addEventListener('change', loadSessions);
    stateFilter.addEventListener('change', loadSessions);
    await loadSessions();
    if (!id) {
      conversation.append(h('p', { class: 'muted' }, 'Create a session or open one. Its name decides which ChatPolicy governs it.'));
      const checkAny = async () => {
        try {
          const r = await api('GET', '/chat/v1/route');
          const said = r.messages || [];
          if (r.reachable) {
            landingBanner.hidden = true;
            landingBanner.replaceChildren();
          } else {
            landingBanner.replaceChildren(h('strong', {}, 'No model can answer right now. '),
              said.length === 1 ? said[0] : h('ul', {}, said.map((m) => h('li', {}, m))), ' ', h('a', { href: '#/status' }, 'Status page'));
            landingBanner.hidden = false;
          }
        } catch (_) { /* the next poll tries again */ }
      };
      checkAny();
      const anyTimer = setInterval(checkAny, 3000);
      view.cleanup.push(() => clearInterval(anyTimer));
      name.focus();
      return;
    }
    await openSession(id, conversation);
  }

  // A modal dialog; `body` gets a Close button; returns the element (removed on close).
  function dialog(title, ...body) {
    const titleId = `dialog-${Math.random().toString(36).slice(2)}`;
    const close = h('button', { type: 'button', class: 'close' }, 'Close');
    const el = h('dialog', { 'aria-labelledby': titleId }, h('h2', { id: titleId }, title), ...body, h('p', {}, close));
    close.addEventListener('click', () => el.close());
    el.addEventListener('close', () => el.remove());
    document.body.append(el);
    el.showModal();
    view.cleanup.push(() => { if (el.open) el.close(); });
    return el;
  }

  const names = (text) => text.split(/[\s,]+/).map((x) => x.trim()).filter(Boolean);

  // The owner shares a session with users or groups, to read or to continue, and revokes.
  async function shareDialog(session) {
    const base = `/chat/v1/sessions/${encodeURIComponent(session.id)}/share`;
    const users = h('input', { id: 'share-users', autocomplete: 'off', placeholder: 'e.g. bob, carol' });
    const groups = h('input', { id: 'share-groups', autocomplete: 'off', placeholder: 'e.g. sre-oncall' });
    const accessSel = h('select', { id: 'share-access' },
      h('option', { value: 'read' }, 'read: follow it'),
      h('option', { value: 'continue' }, 'continue: also ask and steer'));
    const msg = h('div', { 'aria-live': 'polite' });
    const list = h('ul', { class: 'shares', 'aria-label': 'Shared with' });
    const draw = (shares) => {
      list.replaceChildren(...shares.map((x) => {
        const revoke = h('button', { type: 'button', class: 'danger', 'aria-label': `Revoke ${x.kind} ${x.principal}` }, 'Revoke');
        revoke.addEventListener('click', async () => {
          msg.replaceChildren();
          try {
            await api('DELETE', base, x.kind === 'group' ? { groups: [x.principal] } : { users: [x.principal] });
            draw((await api('GET', base)).shares || []);
          } catch (e) { msg.append(errorBox(e)); }
        });
        return h('li', { 'data-share': `${x.kind}:${x.principal}` },
          h('span', {}, `${x.kind === 'group' ? 'group ' : ''}${x.principal}`), h('span', { class: 'badge' }, x.access), revoke);
      }));
      if (!shares.length) list.append(h('li', { class: 'muted' }, 'Not shared with anyone.'));
    };
    const form = h('form', { class: 'dialog-form' },
      h('label', { for: 'share-users' }, 'Users'), users,
      h('label', { for: 'share-groups' }, 'Groups'), groups,
      h('label', { for: 'share-access' }, 'Access'), accessSel,
      h('p', {}, h('button', { class: 'primary', type: 'submit' }, 'Share')), msg);
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      msg.replaceChildren();
      try {
        const out = await api('POST', base, { users: names(users.value), groups: names(groups.value), access: accessSel.value });
        users.value = '';
        groups.value = '';
        draw(out.shares || []);
      } catch (e) { msg.append(errorBox(e)); }
    });
    dialog(`Share ${session.name}`,
      h('p', { class: 'muted' }, 'Everyone else gets “not found”. Whoever continues acts with their own rights.'),
      form, h('h3', {}, 'Shared with'), list);
    try { draw((await api('GET', base)).shares || []); } catch (e) { msg.append(errorBox(e)); }
    users.focus();
  }

  // Whoever may continue a session hands it to the next person with a note.
  function handoverDialog(session) {
    const to = h('input', { id: 'handover-to', required: true, autocomplete: 'off', placeholder: 'e.g. bob' });
    const note = h('textarea', { id: 'handover-note', required: true, maxlength: 4000, placeholder: 'What the next person should know: what you found, what is pending, what to watch.' });
    const msg = h('div', { 'aria-live': 'polite' });
    const submit = h('button', { class: 'primary', type: 'submit' }, 'Hand over');
    const form = h('form', { class: 'dialog-form' },
      h('label', { for: 'handover-to' }, 'To'), to,
      h('label', { for: 'handover-note' }, 'Note'), note,
      h('p', { class: 'muted' }, 'They may continue the session. With a summarize model, a summary of the investigation so far is added; the policy’s notification targets are told.'),
      h('p', {}, submit), msg);
    const el = dialog(`Hand over ${session.name}`, form);
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      msg.replaceChildren();
      submit.disabled = true;
      submit.textContent = 'Handing over…';
      try {
        await api('POST', `/chat/v1/sessions/${encodeURIComponent(session.id)}/handover`, { to: to.value.trim(), note: note.value.trim() });
        el.close();
      } catch (e) {
        msg.append(errorBox(e));
        submit.disabled = false;
        submit.textContent = 'Hand over';
      }
    });
    to.focus();
  }

  async function openSession(id, root) {
    let session;
    try {
      session = await api('GET', `/chat/v1/sessions/${encodeURIComponent(id)}`);
    } catch (e) {
      root.replaceChildren(errorBox(e));
      return;
    }
    const badge = h('span', { class: `badge ${session.status}`, id: 'session-status' }, session.status);
    // Shown while the event stream is down (the browser reconnects by itself).
    const link = h('span', { class: 'badge reconnecting', id: 'reconnecting', role: 'status', hidden: true }, 'reconnecting…');
    const transcript = h('div', { class: 'transcript', id: 'transcript', role: 'log', 'aria-live': 'polite', 'aria-label': 'Transcript' });
    const input = h('textarea', { id: 'message', 'aria-label': 'Message', placeholder: 'Ask about your cluster… (Enter sends, Shift+Enter for a new line)' });
    const send = h('button', { class: 'primary', type: 'submit', id: 'send' }, 'Send');
    const cancel = h('button', { type: 'button', id: 'cancel', hidden: true }, 'Cancel');
    const pause = h('button', { type: 'button', id: 'pause', hidden: true }, 'Pause');
    const resume = h('button', { type: 'button', id: 'resume', class: 'primary', hidden: true }, 'Resume');
    const composer = h('form', { class: 'composer' }, input, h('div', { class: 'buttons' }, send, pause, resume, cancel));
    // Steering a running or paused run: a redirect, optionally rewinding to a step.
    const redirectText = h('input', { id: 'redirect', type: 'text', 'aria-label': 'Redirect the run', placeholder: 'Redirect: e.g. stop, look at the database instead', autocomplete: 'off' });
    const rewind = h('select', { id: 'rewind', 'aria-label': 'Rewind to step' }, h('option', { value: '' }, 'keep every step'));
    const steerMsg = h('div', { 'aria-live': 'polite' });
    const steer = h('form', { class: 'steer', hidden: true }, redirectText, rewind,
      h('button', { type: 'submit', id: 'send-redirect' }, 'Redirect'), steerMsg);
    const access = session.access || 'owner';
    const readOnly = access === 'read';
    const routeBanner = h('div', { class: 'route-banner', id: 'route-banner', role: 'alert', hidden: true });
    const shareBtn = access === 'owner' ? h('button', { type: 'button', id: 'share' }, 'Share') : null;
    const handBtn = readOnly ? null : h('button', { type: 'button', id: 'handover' }, 'Hand over');
    if (shareBtn) shareBtn.addEventListener('click', () => shareDialog(session));
    if (handBtn) handBtn.addEventListener('click', () => handoverDialog(session));
    const bottom = readOnly
      ? [h('p', { class: 'note', id: 'read-only' }, `Shared with you by ${session.user} to read: you can follow it, not post.`)]
      : [steer, composer];
    root.replaceChildren(
      h('div', { class: 'conv-head' },
        h('h2', {}, session.name),
        h('span', { class: 'badge', title: session.trigger ? 'The ChatPolicy of the trigger that started it' : 'The ChatPolicy matched by the session name' }, `policy ${session.policy || '—'}`),
        session.trigger ? h('span', { class: 'badge', id: 'triggered-by', title: `Started by trigger ${session.trigger.name} of ChatPolicy ${session.trigger.policy}` }, `⚡ ${session.trigger.name}`) : null,
        h('span', { class: 'muted' }, `namespace ${session.namespace}`),
        badge, link,
        access === 'owner' ? null : h('span', { class: 'muted', id: 'owner' }, `${session.user}'s session · ${access === 'continue' ? 'you may continue' : 'read only'}`),
        session.title ? h('span', { class: 'muted' }, session.title) : null,
        h('span', { class: 'head-actions' }, shareBtn, handBtn)),
      routeBanner, transcript, ...bottom);

    // No provider of the policy can answer now: say so, with the fix, before anyone asks;
    // gone as soon as a probe finds one (polled).
    const checkRoute = async () => {
      try {
        const r = await api('GET', `/chat/v1/sessions/${encodeURIComponent(id)}/route`);
        if (r.reachable) {
          routeBanner.hidden = true;
          routeBanner.replaceChildren();
        } else {
          routeBanner.replaceChildren(h('strong', {}, 'No model can answer in this session right now. '),
            r.message || '', ' ', h('a', { href: '#/status' }, 'Status page'));
          routeBanner.hidden = false;
        }
      } catch (_) { /* the next poll tries again */ }
    };
    checkRoute();
    const routeTimer = setInterval(checkRoute, 3000);
    view.cleanup.push(() => clearInterval(routeTimer));

    // The transcript follows what arrives while the reader is at its end; scrolled up to
    // read, they stay where they are (their own question brings them back down). Events do
    // not tell the two apart: the scroll event of the page's own scroll can come a frame
    // later, after more was added (chips, then a proposal's placeholder), and a reader's
    // after more arrived. The position does: above where the page last put it is the reader.
    let following = true;
    let pinned = 0;
    const atEnd = () => transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 48;
    const readerMoved = () => transcript.scrollTop < pinned - 1;
    transcript.addEventListener('scroll', () => {
      following = atEnd() || (following && !readerMoved());
    });
    const scroll = (force) => {
      if (force === true) following = true;
      else if (following && readerMoved() && !atEnd()) following = false;
      if (!following) return;
      transcript.scrollTop = transcript.scrollHeight;
      pinned = transcript.scrollTop;
    };
    // The run that controls apply to (the active one, or the last one seen).
    let currentRun = session.activeRun ? session.activeRun.id : null;
    const setStatus = (s) => {
      badge.textContent = s;
      badge.className = `badge ${s}`;
      const busy = ['running', 'requires_action', 'paused', 'pausing', 'awaiting_plan'].includes(s);
      send.disabled = busy;
      cancel.hidden = !busy;
      pause.hidden = s !== 'running';
      resume.hidden = s !== 'paused';
      steer.hidden = !['running', 'paused', 'pausing'].includes(s);
    };
    setStatus(session.status);
    const control = async (path, body) => {
      steerMsg.replaceChildren();
      try {
        return await api('POST', `/chat/v1/sessions/${encodeURIComponent(id)}/runs/${encodeURIComponent(currentRun)}/${path}`, body || {});
      } catch (e) {
        steerMsg.append(errorBox(e));
        return null;
      }
    };
    pause.addEventListener('click', () => control('pause'));
    resume.addEventListener('click', () => control('resume'));
    steer.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const message = redirectText.value.trim();
      if (!message) return;
      const body = { message };
      if (rewind.value) body.rewindTo = Number(rewind.value);
      if (await control('redirect', body)) {
        redirectText.value = '';
        rewind.value = '';
      }
    });

    // A plan the run states (planning: preview or required): its steps, and for a required
    // one the choice of steps to keep, their order, and approve or reject.
    function planCard(d) {
      const steps = (d.steps || []).map((st) => ({ ...st, keep: true }));
      const card = h('article', { class: 'card plan', 'data-plan': d.planId, 'aria-label': 'Plan', tabindex: 0 });
      const result = h('div', { 'aria-live': 'polite' });
      const draw = (decided) => {
        const list = h('ol', {}, steps.map((st, i) => h('li', { 'data-step': st.id },
          h('strong', {}, `${st.id}.`),
          d.mode === 'required' && !decided
            ? h('label', {}, h('input', { type: 'checkbox', checked: st.keep, 'aria-label': `Keep step ${st.id}`, onchange: (ev) => { st.keep = ev.target.checked; } }), ` ${st.purpose} `)
            : h('span', {}, `${st.purpose} `),
          h('code', {}, st.tool),
          d.mode === 'required' && !decided && i > 0
            ? h('button', { type: 'button', 'aria-label': `Move step ${st.id} up`, onclick: () => { [steps[i - 1], steps[i]] = [steps[i], steps[i - 1]]; draw(false); } }, '↑')
            : null)));
        const parts = [h('h3', {}, d.mode === 'required' ? 'Plan — waiting for your approval' : 'Plan (preview)'), list];
        if (d.mode === 'required' && !decided) {
          const decide = async (path, body) => {
            const out = await control(path, body);
            if (out) { draw(true); card.dataset.decided = path.endsWith('approve') ? 'approved' : 'rejected'; }
          };
          parts.push(h('div', { class: 'actions' },
            h('button', { class: 'primary', type: 'button', id: 'approve-plan', 'data-decide': 'approve', onclick: () => decide('plan/approve', { steps: steps.filter((st) => st.keep).map((st) => st.id) }) }, 'Approve plan'),
            h('button', { class: 'danger', type: 'button', id: 'reject-plan', 'data-decide': 'reject', onclick: () => decide('plan/reject') }, 'Reject plan')), result);
        }
        card.replaceChildren(...parts);
      };
      draw(false);
      transcript.append(card);
      scroll();
    }

    // Tool results, for chips of stored calls and for expanding live ones.
    const results = new Map();
    for (const m of session.messages || []) {
      if (m.role === 'tool') results.set(m.toolCallId, m);
    }
    const cards = new Map();
    const chipsById = new Map();
    let live = { text: null, chips: null };

    function chip(call, outcome) {
      const args = JSON.stringify(call.input || {});
      const label = h('span', { class: 'status' }, outcome.label);
      const body = h('pre', {}, outcome.result || '');
      const el = h('details', { class: `chip ${outcome.cls}`, 'data-call': call.id, 'data-tool': call.name },
        h('summary', { title: args }, h('strong', {}, call.name), h('span', { class: 'args' }, args), label),
        body);
      el.addEventListener('toggle', async () => {
        if (!el.open || el.dataset.loaded) return;
        let m = results.get(call.id);
        if (!m) {
          try {
            const fresh = await api('GET', `/chat/v1/sessions/${encodeURIComponent(id)}`);
            for (const x of fresh.messages || []) if (x.role === 'tool') results.set(x.toolCallId, x);
            m = results.get(call.id);
          } catch (_) { m = null; }
        }
        if (m) {
          body.replaceChildren(...toolResult(m.content));
          el.dataset.loaded = '1';
        }
      });
      el.setLabel = (text, cls) => {
        label.textContent = text;
        el.className = `chip ${cls}`;
      };
      chipsById.set(call.id, el);
      return el;
    }

    function note(text, cls, run) {
      transcript.append(h('div', { class: `note ${cls || ''}`, role: cls === 'error' ? 'alert' : null, 'data-run': run }, text));
      scroll();
    }

    async function addCard(proposalId) {
      if (cards.has(proposalId)) return cards.get(proposalId);
      const placeholder = h('div', { class: 'card', 'data-proposal': proposalId }, 'Loading proposal…');
      cards.set(proposalId, placeholder);
      transcript.append(placeholder);
      scroll();
      try {
        const p = await findProposal(proposalId);
        if (p) {
          const card = proposalCard(p);
          placeholder.replaceWith(card);
          cards.set(proposalId, card);
          scroll();
          return card;
        }
        placeholder.textContent = 'This proposal is not visible to you.';
      } catch (e) {
        placeholder.replaceChildren(errorBox(e));
      }
      scroll();
      return placeholder;
    }

    // Hand-overs: a card each, where it happened in the conversation.
    const handedOver = new Set();
    function handoverCard(ho) {
      if (handedOver.has(ho.id)) return;
      handedOver.add(ho.id);
      transcript.append(h('article', { class: 'card handover', 'data-handover': ho.id, 'aria-label': `Hand-over to ${ho.to}` },
        h('h3', {}, `${ho.from} handed this session over to ${ho.to}`),
        h('p', { class: 'handover-note' }, ho.note),
        ho.summary ? h('details', { open: true }, h('summary', {}, 'Summary of the investigation so far'), h('div', { class: 'handover-summary' }, ho.summary)) : null));
      scroll();
    }
    const pendingHandovers = [...(session.handovers || [])];
    const handoversUntil = (at) => {
      while (pendingHandovers.length && (!at || Date.parse(pendingHandovers[0].createdAt) <= Date.parse(at))) {
        handoverCard(pendingHandovers.shift());
      }
    };
    // A user's question; in a shared session, with who asked it when not the reader.
    function question(m, struck) {
      const author = m.author && m.author !== me.user ? h('span', { class: 'author' }, m.author) : null;
      return h('div', { class: `msg user${struck || ''}`, 'data-run': m.runId, 'data-author': m.author || null }, author, m.content);
    }

    // The stored transcript (minus the assistant part of a run in progress: its events
    // rebuild it below, so nothing is shown twice).
    const activeRun = session.activeRun ? session.activeRun.id : null;
    for (const m of session.messages || []) {
      handoversUntil(m.createdAt);
      if (activeRun && m.runId === activeRun && m.role !== 'user') continue;
      const struck = m.superseded ? ' superseded' : '';
      if (m.role === 'user') {
        transcript.append(question(m, struck));
      } else if (m.role === 'assistant') {
        if (m.content) {
          const el = answer(m.content, { class: `msg assistant${struck}`, 'data-run': m.runId, title: m.superseded ? 'Rewound: no longer sent to the model' : null });
          const line = byline(m.createdAt, m.provider, m.model);
          if (line) el.append(line);
          transcript.append(el);
        }
        if ((m.toolCalls || []).length) {
          transcript.append(h('div', { class: 'chips', 'data-run': m.runId }, m.toolCalls.map((c) => {
            const r = results.get(c.id);
            const outcome = !r ? { cls: 'waiting', label: 'no result' }
              : r.isError ? { cls: 'error', label: 'error' } : { cls: 'ok', label: 'ok' };
            return chip(c, { ...outcome, result: r ? r.content : '' });
          })));
          for (const c of m.toolCalls) {
            if (c.name === 'propose_action') {
              const r = results.get(c.id);
              try {
                const v = r && JSON.parse(r.content);
                if (v && v.proposalId) addCard(v.proposalId);
              } catch (_) { /* an error result */ }
            }
          }
        }
      }
    }
    handoversUntil(null);
    // Runs that failed: what went wrong, after what they left in the transcript.
    for (const f of session.failedRuns || []) {
      const mine = [...transcript.querySelectorAll('[data-run]')].filter((el) => el.dataset.run === f.id);
      const box = h('div', { class: 'note error', 'data-run': f.id }, `Failed: ${f.reason}`);
      if (mine.length) mine[mine.length - 1].after(box); else transcript.append(box);
    }
    scroll(true);

    // A run someone else started in a shared session: their question, from the database.
    const showQuestionOf = async (runId) => {
      await new Promise((r) => setTimeout(r, 400));
      if (transcript.querySelector(`.msg.user[data-run="${CSS.escape(runId)}"]`)) return;
      try {
        const fresh = await api('GET', `/chat/v1/sessions/${encodeURIComponent(id)}`);
        const m = (fresh.messages || []).find((x) => x.role === 'user' && x.runId === runId);
        if (!m || transcript.querySelector(`.msg.user[data-run="${CSS.escape(runId)}"]`)) return;
        const bubble = question(m);
        const first = [...transcript.children].find((el) => el.dataset.run === runId);
        if (first) first.before(bubble); else transcript.append(bubble);
        scroll();
      } catch (_) { /* shown on reload */ }
    };

    // Runs whose end the stream has already shown (a run can fail before the POST that
    // started it has answered).
    const ended = new Set();
    // Live events: replayed from where the stored transcript ends, then followed.
    let lastSeq = session.activeRun ? session.activeRun.afterSeq : (session.eventSeq || 0);
    const handlers = {
      'run.lifecycle': (d) => {
        if (d.runId) currentRun = d.runId;
        if (d.state === 'started') {
          setStatus('running');
          if (d.runId) showQuestionOf(d.runId);
          live = { text: null, chips: null };
          rewind.replaceChildren(h('option', { value: '' }, 'keep every step'));
        } else if (d.state === 'pausing') {
          setStatus('pausing');
          note('Pausing at the next step…', '', d.runId);
        } else if (d.state === 'paused') {
          setStatus('paused');
          note('Paused: nothing is sent to the model or a tool until you resume.', '', d.runId);
        } else if (d.state === 'awaiting_plan') {
          setStatus('awaiting_plan');
          for (const el of chipsById.values()) {
            if (el.dataset.tool === 'submit_plan' && el.classList.contains('running')) el.setLabel('waiting for your approval', 'waiting');
          }
        } else if (d.state === 'redirecting') {
          note('Redirect kept: the model reads it at its next step.', '', d.runId);
        } else if (d.state === 'running') {
          setStatus('running');
          live = { text: null, chips: null };
          if (d.reason) note(d.reason === 'redirected' ? 'Redirected.' : `Going on: ${d.reason}.`, '', d.runId);
        }
        else if (d.state === 'requires_action') {
          setStatus('requires_action');
          for (const el of chipsById.values()) {
            if (el.classList.contains('running')) el.setLabel('waiting for the client to run it', 'waiting');
          }
          note('Waiting for the client to run its tools.', '', d.runId);
        } else {
          ended.add(d.runId);
          setStatus(d.state === 'failed' ? 'failed' : 'idle');
          if (d.state === 'cancelled') note('Cancelled.', '', d.runId);
          live = { text: null, chips: null };
          if (view.refreshSessions) view.refreshSessions();
        }
      },
      'step.boundary': (d) => {
        live.text = null;
        live.chips = null;
        if (d.step) rewind.append(h('option', { value: String(d.step) }, `rewind to step ${d.step}`));
      },
      // Said once the step's answer is stored: under its text, who wrote it.
      'step.answered': (d) => {
        if (!live.text || live.text.dataset.run !== d.runId) return;
        const line = byline(new Date().toISOString(), d.provider, d.model);
        if (line) live.text.append(line);
        scroll();
      },
      'plan.proposal': (d) => planCard(d),
      handover: (d) => handoverCard(d),
      follow_ups: (d) => {
        // Asked after the title is written: the list shows the new incident summary.
        if (view.refreshSessions) view.refreshSessions();
        const chips = h('div', { class: 'follow-ups', 'aria-label': 'Suggested questions' },
          (d.questions || []).map((q) => h('button', { type: 'button', class: 'follow-up', onclick: () => { input.value = q; submit(); } }, q)));
        transcript.append(chips);
        scroll();
      },
      'text.delta': (d) => {
        if (!live.text) {
          live.text = h('div', { class: 'msg assistant', 'data-run': d.runId, 'aria-live': 'polite' });
          live.text.raw = '';
          transcript.append(live.text);
        }
        // The whole answer so far is rendered again: a table or a code block takes its
        // shape as it grows.
        live.text.raw += d.text;
        answer(live.text.raw, null, live.text);
        scroll();
      },
      'tool.start': (d) => {
        if (!live.chips) {
          live.chips = h('div', { class: 'chips', 'data-run': d.runId });
          transcript.append(live.chips);
        }
        live.chips.append(chip({ id: d.callId, name: d.name, input: d.input }, { cls: 'running', label: 'running…' }));
        live.text = null;
        scroll();
      },
      'tool.end': (d) => {
        const el = chipsById.get(d.callId);
        if (!el) return;
        let cls = 'ok';
        let text = 'ok';
        if (d.isError) { cls = d.errorKind || 'error'; text = d.errorKind || 'error'; }
        else if (d.truncated) { cls = 'truncated'; text = 'truncated'; }
        el.setLabel(`${text} · ${seconds(d.durationMs || 0)}`, cls);
        el.querySelector('pre').textContent = d.preview || '';
      },
      notice: (d) => note(d.message, '', d.runId),
      error: (d) => note(`${d.code}: ${d.message}`, 'error', d.runId),
      'proposal.created': (d) => { addCard(d.proposalId); },
      'proposal.updated': async (d) => {
        const card = await addCard(d.proposalId);
        try {
          const p = await findProposal(d.proposalId);
          if (p && card.refill) { card.refill(p); scroll(); }
        } catch (_) { /* shown on the next update */ }
      },
    };
    const es = new EventSource(`/chat/v1/sessions/${encodeURIComponent(id)}/events?after=${lastSeq}`);
    view.cleanup.push(() => es.close());
    es.addEventListener('error', () => { link.hidden = false; });
    es.addEventListener('open', () => { link.hidden = true; });
    for (const [type, handle] of Object.entries(handlers)) {
      es.addEventListener(type, (ev) => {
        const seq = Number(ev.lastEventId);
        // The browser reconnects with Last-Event-ID; anything already shown is dropped.
        if (Number.isFinite(seq) && seq <= lastSeq) return;
        if (Number.isFinite(seq)) lastSeq = seq;
        let data = {};
        try { data = JSON.parse(ev.data); } catch (_) { return; }
        handle(data);
      });
    }

    const submit = async () => {
      const content = input.value.trim();
      if (!content || send.disabled) return;
      send.disabled = true;
      try {
        const started = await api('POST', `/chat/v1/sessions/${encodeURIComponent(id)}/messages`, { content });
        // The question goes before anything its run has already shown.
        const first = [...transcript.children].find((el) => el.dataset.run === started.runId);
        const bubble = h('div', { class: 'msg user', 'data-run': started.runId }, content);
        if (first) first.before(bubble); else transcript.append(bubble);
        input.value = '';
        if (!ended.has(started.runId)) {
          live = { text: null, chips: null };
          setStatus('running');
        } else {
          send.disabled = false;
        }
        scroll(true);
      } catch (e) {
        note(`${e.code || 'error'}: ${e.message}`, 'error');
        send.disabled = false;
      }
    };
    composer.addEventListener('submit', (ev) => { ev.preventDefault(); submit(); });
    input.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        submit();
      }
    });
    cancel.addEventListener('click', async () => {
      try { await api('POST', `/chat/v1/sessions/${encodeURIComponent(id)}/cancel`); }
      catch (e) { note(e.message, 'error'); }
    });
    input.focus();
  }

  // ---- status --------------------------------------------------------------------------
  const PALETTE = ['#1f5fa8', '#e07b00', '#2e8b57', '#8e44ad', '#c0392b', '#16a085', '#7f8c8d'];

  function spendChart(days) {
    const end = new Date();
    const labels = [];
    for (let i = 6; i >= 0; i--) {
      const d = new Date(Date.UTC(end.getUTCFullYear(), end.getUTCMonth(), end.getUTCDate() - i));
      labels.push(d.toISOString().slice(0, 10));
    }
    const providers = [...new Set(days.map((d) => d.provider))].sort();
    const total = (day) => days.filter((d) => d.day === day).reduce((a, d) => a + d.costUsd, 0);
    const max = Math.max(0.01, ...labels.map(total));
    const W = 230, H = 70, bw = 24, gap = 8;
    const svg = h('svg:svg', { class: 'spend', width: W, height: H + 14, viewBox: `0 0 ${W} ${H + 14}`, role: 'img',
      'aria-label': `Spend per day and provider, last 7 days: ${labels.map((l) => `${l} ${usd(total(l))}`).join(', ')}` });
    labels.forEach((day, i) => {
      let y = H;
      providers.forEach((p, j) => {
        const v = days.filter((d) => d.day === day && d.provider === p).reduce((a, d) => a + d.costUsd, 0);
        const bh = (v / max) * (H - 4);
        if (bh <= 0) return;
        y -= bh;
        svg.append(h('svg:rect', { x: i * (bw + gap), y, width: bw, height: bh, fill: PALETTE[j % PALETTE.length] },
          h('svg:title', {}, `${day} ${p}: ${usd(v)}`)));
      });
      svg.append(h('svg:text', { x: i * (bw + gap) + bw / 2, y: H + 12, 'font-size': 9, 'text-anchor': 'middle', fill: '#5f6b7a' }, day.slice(8)));
    });
    const legend = h('div', { class: 'muted' },
      providers.map((p, j) => h('span', {},
        h('svg:svg', { width: 10, height: 10, 'aria-hidden': 'true' }, h('svg:rect', { width: 10, height: 10, fill: PALETTE[j % PALETTE.length] })),
        ` ${p} `)));
    return h('div', {}, svg, providers.length ? legend : h('span', { class: 'muted' }, 'no spend in the last 7 days'));
  }

  async function statusView() {
    const sections = h('div', { class: 'grid' }, h('p', { class: 'muted' }, 'Loading…'));
    show(sections);
    let providers, tools, policies;
    try {
      [providers, tools, policies] = await Promise.all([
        api('GET', '/api/v1/llm/providers'), api('GET', '/api/v1/tools'), api('GET', '/api/v1/policies')]);
    } catch (e) {
      sections.replaceChildren(errorBox(e));
      return;
    }
    const yesNo = (ok, text) => h('span', { class: ok ? 'yes' : 'no' }, text || (ok ? 'yes' : 'no'));
    const providerRows = (providers.items || []).map((p) => {
      const ready = condition(p, 'Ready') || {};
      const reach = condition(p, 'Reachable');
      const priced = condition(p, 'Priced');
      const models = (p.statusModels && p.statusModels.length ? p.statusModels : [p.defaultModel]).filter(Boolean);
      return h('tr', { 'data-provider': p.name },
        h('td', {}, h('strong', {}, p.name), h('div', { class: 'muted' }, p.namespace)),
        h('td', {}, p.type || '', h('div', { class: 'muted' }, p.locality || '')),
        h('td', {}, yesNo(p.available), h('div', { class: 'muted' }, ready.message || '')),
        h('td', {}, reach ? yesNo(reach.status === 'True', reach.status === 'True' ? 'reachable' : 'unreachable') : h('span', { class: 'muted' }, 'not probed yet'),
          h('div', { class: 'muted' }, reach ? reach.message : '')),
        h('td', {}, models.join(', '), priced && priced.status === 'False' ? h('div', { class: 'no' }, priced.message) : null));
    });
    const builtin = (tools.builtin || []).map((t) => h('tr', {}, h('td', {}, h('strong', {}, t.name)), h('td', {}, 'built-in'),
      h('td', {}, yesNo(true)), h('td', {}, 'sessions whose policy allows it'), h('td', { class: 'muted' }, t.description || '')));
    const plugins = (tools.items || []).map((t) => h('tr', {}, h('td', {}, h('strong', {}, t.toolName || t.name)),
      h('td', {}, `plugin ${(t.backend && t.backend.type) || ''}`), h('td', {}, yesNo(t.available), h('div', { class: 'muted' }, (condition(t, 'Ready') || {}).message || '')),
      h('td', {}, (t.allowedSessions || ['*']).join(', ')), h('td', { class: 'muted' }, t.description || '')));
    const policyRows = (policies.items || []).map((p) => {
      const spend = p.spend || {};
      const pct = spend.percentUsed;
      const routes = (p.routes || []).map((r) => `${r.provider}/${r.fastModel ? `${r.fastModel} → ` : ''}${r.model}`).join(', then ');
      const skipped = (p.skipped || []).map((s) => `${s.provider}: ${s.reason}`);
      return h('tr', { 'data-policy': p.name },
        h('td', {}, h('strong', {}, p.name), h('div', { class: 'muted' }, `${p.namespace} · ${((p.spec || {}).sessions || []).join(', ')}`)),
        h('td', {}, (p.spec || {}).mode || 'normal'),
        h('td', {}, routes || h('span', { class: 'no' }, 'no provider can answer'), skipped.map((s) => h('div', { class: 'muted' }, s))),
        h('td', { class: 'spend-today' }, `${usd(spend.todayUsd)}${spend.dailyUsdLimit !== null && spend.dailyUsdLimit !== undefined ? ` of ${usd(spend.dailyUsdLimit)}` : ''}`,
          pct !== null && pct !== undefined ? h('div', { class: `bar ${pct >= 80 ? 'hot' : ''}`, role: 'meter', 'aria-valuenow': pct, 'aria-valuemin': 0, 'aria-valuemax': 100, 'aria-label': 'Share of the daily budget used' },
            h('span', { 'data-width': Math.min(100, pct) })) : null),
        h('td', {}, spendChart(p.spendByDay || [])));
    });
    const table = (caption, heads, rows) => h('div', { class: 'panel' },
      h('h2', { class: 'section' }, caption),
      rows.length ? h('table', {}, h('thead', {}, h('tr', {}, heads.map((x) => h('th', { scope: 'col' }, x)))), h('tbody', {}, rows))
        : h('p', { class: 'muted' }, 'None.'));
    const sso = me.sso;
    const kube = { token: 'your own ID token, judged by the API server', impersonation: 'Kortex impersonating you (your verified user and groups)' };
    const signInPanel = h('div', { class: 'panel', id: 'sign-in-mode' },
      h('h2', { class: 'section' }, 'Sign-in'),
      h('p', {}, sso ? `Single sign-on with ${sso.provider} (${sso.issuer}).` : `Sign-in: ${me.mode}${me.proxy ? ', behind an authenticating proxy' : ''}.`),
      h('p', {}, `You are ${me.user}; Kubernetes sees you through `,
        h('strong', { 'data-kubernetes-mode': me.kubernetesMode || 'none' }, me.kubernetesMode ? kube[me.kubernetesMode] : 'no identity of yours (Kortex reads with its own rights)'), '.'));
    sections.replaceChildren(
      signInPanel,
      table('Providers', ['Provider', 'Type', 'Available', 'Reachability', 'Models'], providerRows),
      table('Tools', ['Tool', 'Kind', 'Available', 'Sessions', 'Description'], [...builtin, ...plugins]),
      table('Policies', ['Policy', 'Mode', 'Providers now', 'Spend today', 'Last 7 days'], policyRows));
    // Widths through the CSSOM (the page's CSP allows no inline style attributes).
    sections.querySelectorAll('[data-width]').forEach((el) => { el.style.width = `${el.dataset.width}%`; });
  }

  // ---- usage (admins) --------------------------------------------------------------------
  const USAGE_SINCE = [['7d', 'last 7 days'], ['30d', 'last 30 days'], ['90d', 'last 90 days']];
  const USAGE_BY = [['day', 'day'], ['provider', 'provider'], ['model', 'model'], ['policy', 'policy'], ['user', 'user or gateway team']];

  function csvCell(v) {
    const text = String(v);
    return /[",\n\r]/.test(text) || /^[=+\-@]/.test(text) ? `"${text.replace(/"/g, '""').replace(/^([=+\-@])/, "'$1")}"` : text;
  }

  function usageBars(items, by) {
    const rows = by === 'day' ? [...items].sort((a, b) => a.key.localeCompare(b.key)) : [...items].sort((a, b) => b.costUsd - a.costUsd || b.requests - a.requests).slice(0, 15);
    const metric = rows.some((r) => r.costUsd > 0) ? 'costUsd' : 'requests';
    const max = Math.max(1e-9, ...rows.map((r) => r[metric]));
    const calls = (n) => `${n} call${n === 1 ? '' : 's'}`;
    const label = (r) => (metric === 'costUsd' ? usd(r.costUsd) : calls(r.requests));
    const W = 560, row = 22, left = 170;
    const svg = h('svg:svg', { class: 'usage-chart', width: W, height: rows.length * row + 4, viewBox: `0 0 ${W} ${rows.length * row + 4}`, role: 'img',
      'aria-label': `${metric === 'costUsd' ? 'Spend' : 'Calls'} by ${by}: ${rows.map((r) => `${r.key} ${label(r)}`).join(', ')}` });
    rows.forEach((r, i) => {
      const y = i * row + 2;
      const bw = Math.max(1, (r[metric] / max) * (W - left - 90));
      svg.append(h('svg:text', { x: left - 6, y: y + 14, 'text-anchor': 'end', class: 'usage-key' }, r.key.length > 26 ? `${r.key.slice(0, 25)}…` : r.key));
      svg.append(h('svg:rect', { x: left, y: y + 3, width: bw, height: row - 8, rx: 3, class: 'usage-bar' }, h('svg:title', {}, `${r.key}: ${label(r)}`)));
      svg.append(h('svg:text', { x: left + bw + 6, y: y + 14, class: 'usage-value' }, label(r)));
    });
    return svg;
  }

  async function usageView() {
    const q = new URLSearchParams((location.hash.split('?')[1]) || '');
    const since = USAGE_SINCE.some(([v]) => v === q.get('since')) ? q.get('since') : '30d';
    const by = USAGE_BY.some(([v]) => v === q.get('by')) ? q.get('by') : 'day';
    const go = (s, b) => { location.hash = `#/usage?since=${s}&by=${b}`; };
    const sinceSel = h('select', { id: 'usage-since' }, USAGE_SINCE.map(([v, t]) => h('option', { value: v, selected: v === since }, t)));
    const bySel = h('select', { id: 'usage-by' }, USAGE_BY.map(([v, t]) => h('option', { value: v, selected: v === by }, t)));
    sinceSel.addEventListener('change', () => go(sinceSel.value, bySel.value));
    bySel.addEventListener('change', () => go(sinceSel.value, bySel.value));
    const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));
    show(h('section', { class: 'panel usage', 'aria-label': 'Usage' },
      h('h2', {}, 'Usage and spend'),
      h('div', { class: 'usage-controls' },
        h('label', { for: 'usage-since' }, 'Period'), sinceSel,
        h('label', { for: 'usage-by' }, 'By'), bySel),
      body));
    let data;
    try {
      data = await api('GET', `/api/v1/usage?since=${encodeURIComponent(since)}&by=${encodeURIComponent(by)}`);
    } catch (e) {
      body.replaceChildren(e.status === 403
        ? h('p', { role: 'alert', class: 'error' }, 'Usage across users is for admins (the group kortex-admins, or RBAC get on /kortex/usage).')
        : errorBox(e));
      return;
    }
    const items = data.items || [];
    const t = data.totals || { requests: 0, inputTokens: 0, outputTokens: 0, costUsd: 0 };
    const header = ['key', 'requests', 'inputTokens', 'outputTokens', 'costUsd', 'estimatedRequests'];
    const csv = [header.join(','), ...items.map((r) => header.map((k) => csvCell(r[k] ?? '')).join(','))].join('\r\n') + '\r\n';
    const download = h('a', { class: 'button', id: 'usage-csv', download: `kortex-usage-${by}-${since}.csv`,
      href: URL.createObjectURL(new Blob([csv], { type: 'text/csv' })) }, 'Download CSV');
    view.cleanup.push(() => URL.revokeObjectURL(download.href));
    const num = (n) => Number(n || 0).toLocaleString('en-US');
    body.replaceChildren(
      h('p', { class: 'usage-totals' }, `Since ${String(data.since || '').slice(0, 10)}: `,
        h('strong', {}, usd(t.costUsd || 0)), ` · ${num(t.requests)} call${t.requests === 1 ? '' : 's'} · ${num(t.inputTokens)} tokens in · ${num(t.outputTokens)} out`),
      items.length ? usageBars(items, by) : h('p', { class: 'muted' }, 'No usage in this period.'),
      h('div', { class: 'table-wrap' }, h('table', { class: 'usage-table' },
        h('thead', {}, h('tr', {}, [by === 'user' ? 'user or team' : by, 'calls', 'tokens in', 'tokens out', 'spend (USD)'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {}, items.map((r) => h('tr', { 'data-key': r.key },
          h('td', {}, r.key), h('td', { class: 'num' }, num(r.requests)), h('td', { class: 'num' }, num(r.inputTokens)),
          h('td', { class: 'num' }, num(r.outputTokens)), h('td', { class: 'num' }, usd(r.costUsd))))))),
      h('div', { class: 'actions' }, download));
  }

  // ---- evals ---------------------------------------------------------------------------
  /** Pass rate over time, a line per configuration (`kortex eval --record`). */
  function evalChart(items, labels) {
    const W = 640; const H = 200; const pad = 34;
    const times = items.map((r) => Date.parse(r.at));
    const t0 = Math.min(...times); const t1 = Math.max(...times);
    const x = (t) => pad + (t1 === t0 ? (W - 2 * pad) / 2 : ((t - t0) / (t1 - t0)) * (W - 2 * pad));
    const y = (rate) => H - pad - rate * (H - 2 * pad);
    const ns = 'http://www.w3.org/2000/svg';
    const el = (tag, attrs, text) => {
      const e = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
      if (text !== undefined) e.textContent = text;
      return e;
    };
    const svg = el('svg', { class: 'eval-chart', viewBox: `0 0 ${W} ${H}`, role: 'img',
      'aria-label': `Pass rate over time for ${labels.join(', ')}` });
    for (const rate of [0, 0.5, 1]) {
      svg.append(el('line', { x1: pad, x2: W - pad, y1: y(rate), y2: y(rate), class: 'grid' }));
      svg.append(el('text', { x: 2, y: y(rate) + 4, class: 'axis' }, `${rate * 100}%`));
    }
    labels.forEach((label, i) => {
      const points = items.filter((r) => r.label === label);
      const colour = PALETTE[i % PALETTE.length];
      svg.append(el('polyline', { fill: 'none', stroke: colour, 'stroke-width': 2,
        points: points.map((r) => `${x(Date.parse(r.at)).toFixed(1)},${y(r.passRate).toFixed(1)}`).join(' ') }));
      for (const r of points) {
        const dot = el('circle', { cx: x(Date.parse(r.at)).toFixed(1), cy: y(r.passRate).toFixed(1), r: 4, fill: colour });
        dot.append(el('title', {}, `${label}: ${Math.round(r.passRate * 100)}% (${r.passed}/${r.attempts}) on ${new Date(r.at).toLocaleString()}`));
        svg.append(dot);
      }
    });
    const legend = h('ul', { class: 'legend' }, labels.map((label, i) =>
      h('li', {}, h('span', { class: 'swatch', style: `background:${PALETTE[i % PALETTE.length]}` }), label)));
    return h('figure', { class: 'eval-figure' }, svg, legend);
  }

  async function evalsView() {
    const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));
    show(h('section', { class: 'panel evals', 'aria-label': 'Evals' },
      h('h2', {}, 'Investigation quality'),
      h('p', { class: 'muted' }, 'Results of kortex eval --record: how often each policy or model found the cause in the scenarios, over the last 90 days.'),
      body));
    let data;
    try {
      data = await api('GET', '/api/v1/evals?since=90d');
    } catch (e) {
      body.replaceChildren(e.status === 403
        ? h('p', { role: 'alert', class: 'error' }, 'Eval results are for admins (the group kortex-admins, or RBAC get on /kortex/evals).')
        : errorBox(e));
      return;
    }
    const items = data.items || [];
    if (!items.length) {
      body.replaceChildren(h('p', { class: 'muted' }, 'No recorded eval yet: run kortex eval --scenarios evals/ --manifests … --record.'));
      return;
    }
    const labels = [...new Set(items.map((r) => r.label))];
    const pct = (v) => `${Math.round(v * 100)}%`;
    body.replaceChildren(
      evalChart(items, labels),
      h('div', { class: 'table-wrap' }, h('table', { class: 'evals-table' },
        h('thead', {}, h('tr', {}, ['when', 'configuration', 'suite', 'passed', 'pass rate (95% interval)', 'tokens', 'spend (USD)'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {}, [...items].reverse().map((r) => h('tr', { 'data-label': r.label },
          h('td', {}, ago(r.at)), h('td', {}, r.label), h('td', {}, r.suite),
          h('td', { class: 'num' }, `${r.passed}/${r.attempts}`),
          h('td', { class: 'num' }, `${pct(r.passRate)} (${pct(r.interval[0])}–${pct(r.interval[1])})`),
          h('td', { class: 'num' }, Number(r.inputTokens + r.outputTokens).toLocaleString('en-US')),
          h('td', { class: 'num' }, usd(r.costUsd))))))));
  }

  // ---- routing -------------------------------------------------------------------------
  async function route() {
    if (!me) return;
    const [, rawPage, arg] = (location.hash || '#/chat').split('/');
    const page = (rawPage || '').split('?')[0];
    document.querySelectorAll('[data-nav]').forEach((a) => a.classList.toggle('active', a.dataset.nav === (page || 'chat')));
    try {
      if (page === 'proposals') await proposalsView();
      else if (page === 'status') await statusView();
      else if (page === 'usage') await usageView();
      else if (page === 'evals') await evalsView();
      else await chatView(arg ? decodeURIComponent(arg) : null);
    } catch (e) {
      if (e.status === 401) signIn(e.code === 'signed_out' ? e.message : 'Your sign-in expired; sign in again.');
      else show(errorBox(e));
    }
    main.focus({ preventScroll: true });
  }

  async function boot() {
    try {
      me = await api('GET', '/auth/v1/me');
    } catch (e) {
      if (e.status === 401) { signIn(e.code === 'signed_out' ? e.message : null); return; }
      show(errorBox(e));
      return;
    }
    renderWho();
    await route();
  }

  // ---- keyboard shortcuts -----------------------------------------------------------------
  // Single keys outside text fields (Escape also in the message box); `?` lists them.
  const SHORTCUTS = [
    ['?', 'Show these shortcuts'],
    ['n', 'New session: focus its name'],
    ['/', 'Focus the message box'],
    ['Esc', 'Cancel the running run (also from the message box)'],
    ['a', 'Approve the focused proposal or plan (focus a card with Tab)'],
    ['r', 'Reject the focused proposal or plan'],
  ];
  let shortcutsDialog = null;
  function showShortcuts() {
    if (!shortcutsDialog) {
      const close = h('button', { type: 'button', class: 'primary' }, 'Close');
      shortcutsDialog = h('dialog', { id: 'shortcuts', 'aria-labelledby': 'shortcuts-title' },
        h('h2', { id: 'shortcuts-title' }, 'Keyboard shortcuts'),
        h('table', { class: 'shortcuts' }, h('tbody', {}, SHORTCUTS.map(([k, what]) => h('tr', {}, h('th', { scope: 'row' }, h('kbd', {}, k)), h('td', {}, what))))),
        h('div', { class: 'actions' }, close));
      close.addEventListener('click', () => shortcutsDialog.close());
      document.body.append(shortcutsDialog);
    }
    if (!shortcutsDialog.open) shortcutsDialog.showModal();
  }
  document.addEventListener('keydown', (ev) => {
    if (ev.ctrlKey || ev.metaKey || ev.altKey || ev.isComposing || !me) return;
    const t = ev.target;
    const typing = t instanceof HTMLElement && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName));
    if (document.querySelector('dialog[open]')) return;
    if (ev.key === 'Escape') {
      const cancelButton = document.getElementById('cancel');
      if (cancelButton && !cancelButton.hidden) { ev.preventDefault(); cancelButton.click(); }
      return;
    }
    if (typing) return;
    const focusedCard = t instanceof HTMLElement ? t.closest('article.card') : null;
    if (ev.key === '?') { ev.preventDefault(); showShortcuts(); }
    else if (ev.key === 'n') {
      const field = document.getElementById('new-session-name');
      if (field) { ev.preventDefault(); field.focus(); } else { location.hash = '#/chat'; }
    } else if (ev.key === '/') {
      const box = document.getElementById('message');
      if (box) { ev.preventDefault(); box.focus(); }
    } else if ((ev.key === 'a' || ev.key === 'r') && focusedCard) {
      const button = focusedCard.querySelector(`button[data-decide="${ev.key === 'a' ? 'approve' : 'reject'}"]:not([disabled])`);
      if (button) { ev.preventDefault(); button.click(); }
    }
  });

  // ---- theme ---------------------------------------------------------------------------
  // The system's preference until the toggle chooses; the choice is kept in this browser.
  const themeButton = document.getElementById('theme');
  const systemDark = window.matchMedia('(prefers-color-scheme: dark)');
  function applyTheme() {
    let chosen = null;
    try { chosen = localStorage.getItem('kortex-theme'); } catch (_) { chosen = null; }
    if (chosen === 'dark' || chosen === 'light') document.documentElement.dataset.theme = chosen;
    else delete document.documentElement.dataset.theme;
    const dark = chosen ? chosen === 'dark' : systemDark.matches;
    if (themeButton) themeButton.setAttribute('aria-pressed', String(dark));
  }
  if (themeButton) {
    themeButton.addEventListener('click', () => {
      const dark = themeButton.getAttribute('aria-pressed') === 'true';
      try { localStorage.setItem('kortex-theme', dark ? 'light' : 'dark'); } catch (_) { /* private mode */ }
      applyTheme();
    });
  }
  systemDark.addEventListener('change', applyTheme);
  applyTheme();

  window.addEventListener('hashchange', route);
  boot();
})();
