// SPDX-License-Identifier: Apache-2.0
// Sign-in (master-target/dashboard.h): the token typed in, or from the URL
// fragment (#token=...), is checked by POST /ui/session, which sets the
// session cookie for GET /ui; the page keeps it in this tab's sessionStorage
// for its API calls.
'use strict';

async function signIn(token) {
  const err = document.getElementById('error');
  err.classList.add('hidden');
  let r;
  try {
    r = await fetch('/ui/session', {method: 'POST', headers: {'Authorization': 'Bearer ' + token}, cache: 'no-store'});
  } catch (e) {
    err.textContent = 'The master target did not answer: ' + e.message;
    err.classList.remove('hidden');
    return;
  }
  if (r.status === 401) {
    err.textContent = 'Unauthorized: this token is not valid at this master target.';
    err.classList.remove('hidden');
    document.body.dataset.state = 'unauthorized';
    return;
  }
  if (!r.ok) {
    err.textContent = 'Sign-in failed: HTTP ' + r.status;
    err.classList.remove('hidden');
    return;
  }
  sessionStorage.setItem('cdp_token', token);
  location.replace('/ui');
}

document.addEventListener('DOMContentLoaded', () => {
  const form = document.getElementById('login');
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = document.getElementById('token').value.trim();
    if (t) signIn(t);
  });
  // A link /ui/login#token=... (also followed from this very page: no reload then).
  const fromFragment = () => {
    const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
    if (!m) return false;
    history.replaceState(null, '', location.pathname);  // the token leaves the address bar
    signIn(decodeURIComponent(m[1]));
    return true;
  };
  window.addEventListener('hashchange', fromFragment);
  if (!fromFragment()) document.getElementById('token').focus();
});
