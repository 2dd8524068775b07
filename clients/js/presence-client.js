// presence-client.js: a small, dependency-free client for presence-server.
// Works in browsers (a plain <script>, or as a CommonJS or ES module: the npm
// package `presence-client`) and in Node 20+: the global WebSocket where there
// is one (Node 22+), else the `ws` package when it is installed, or any
// WebSocket class passed as `WebSocket`.
//
//   const client = new PresenceClient({ url: "ws://host:8080/ws", user: "alice", device: "tab-1" });
//   // With JWT auth: the token goes as the first frame, never into the URL,
//   // and refreshToken() is asked for a fresh one before it expires.
//   const client = new PresenceClient({ url, device: "tab-1", token, refreshToken: async () => fetchToken() });
//   client.onSnapshot = (records) => ...;       // answer to watch(): current records
//   client.onChange = (record) => ...;          // live transition of a watched user
//   client.onSelf = (record) => ...;            // my own record (a status set on any of my devices)
//   client.onState = (state, info) => ...;      // "connecting" | "open" | "reconnecting" | "closed"
//                                               // closed for good: info.willRetry false, info.code, info.reason
//   client.onError = (error) => ...;            // {code, message} error frames (session goes on)
//   client.connect();
//   client.watch(["bob", "carol"]);             // may be called before the connection is open
//   client.watch(["dave"], { devices: true });  // also onChange when dave's device count changes
//   client.setStatus("away", "in a meeting");
//   client.setStatus("busy", { text: "in a call", until: Date.now() + 30 * 60e3 }); // back to online then
//   // In a browser: away after 5 idle minutes while online, back on activity (client.idle, onIdle).
//   new PresenceClient({ url, user, device, autoAway: { idleMs: 5 * 60e3 } });
//   const room = client.join("doc:42", { state: { page: 1 } }); // rooms: who is here
//   // A room the app's backend signs tokens for (--room-policy 'doc:*=token'):
//   // pass getToken: async (room) => fetchRoomToken(room) to the constructor, or
//   // client.join("doc:42", { token }) for one room.
//   room.onError = (e) => ...;                  // forbidden, removed, token_expired, unavailable...
//   room.onSync = room.onJoin = room.onLeave = room.onUpdate = () => render(room.members);
//   room.onTyping = (users) => ...;             // others typing now, sorted
//   room.update({ page: 2 }); room.typing(); room.leave();
//   // Live cursors: call update() on every mouse move; the client sends at most
//   // one room_state per roomStateIntervalMs (the latest), and the others' moves
//   // arrive batched, once per server tick:
//   room.onUpdates = (updates) => draw(updates);   // [{user, device, state}, ...]
//
// The client reconnects by itself with exponential backoff and full jitter,
// and after each reconnect re-sends the chosen status, the watch list and the
// joins of its rooms (with their last states), so
// an app only has to keep rendering what onSnapshot and onChange hand it.
(function (global) {
  "use strict";

  /**
   * The WebSocket class when the caller passed none: the global one, else (in
   * Node 20, which has none) the `ws` package if it is installed: beside this
   * file, or in the application. `npm install <folder>` links the folder, and
   * Node resolves from the link's target, where the app's ws is not: so the
   * app's own ws is looked up from its main script and from its working
   * directory too.
   */
  function defaultWebSocket() {
    if (global.WebSocket) return global.WebSocket;
    // module.require rather than require, so that bundlers for browsers
    // (which have a global WebSocket) do not pull ws in.
    if (typeof module === "undefined" || !module || typeof module.require !== "function") return null;
    const tries = [() => module.require("ws")];
    try {
      const { createRequire } = module.require("module");
      const main = typeof require === "function" ? require.main : null;
      if (main && main.filename) tries.push(() => createRequire(main.filename)("ws"));
      if (typeof process === "object" && process.cwd) tries.push(() => createRequire(`${process.cwd()}/`)("ws"));
    } catch (e) {
      // not Node: only the first try.
    }
    for (const attempt of tries) {
      try {
        return attempt();
      } catch (e) {
        // not there: the next place, else the constructor says what to do.
      }
    }
    return null;
  }

  /** Close codes after which reconnecting cannot help (4401 only without refreshToken). */
  const FINAL_CLOSE_CODES = [1008, 4001];

  /** The wait a 1013 close asks for (`retry_after_ms=<n>` in its reason), at most a minute; 0 when none. */
  function retryHint(code, reason) {
    if (code !== 1013) return 0;
    const m = /retry_after_ms=(\d+)/.exec(reason || "");
    return m ? Math.min(Number(m[1]), 60000) : 0;
  }

  /** Statuses a client may choose. `invisible` is refused by servers without privacy support. */
  const STATUSES = ["online", "away", "busy", "invisible"];

  /** Join refusals that a retry would only repeat: such a room is not joined again. */
  const REFUSED = ["forbidden", "room_full", "too_many_rooms", "invalid_id", "state_too_large"];
  /** Errors that end a room for good, joined or not: the server refused or removed it. */
  const ENDED = ["forbidden", "removed"];
  /** A typer is listed until this long after its last `typing:true` signal. */
  const TYPING_TTL_MS = 5000;
  /** What counts as activity for autoAway (on the window, else the document). */
  const ACTIVITY_EVENTS = ["pointermove", "pointerdown", "mousemove", "mousedown", "keydown", "wheel", "touchstart", "focus"];
  /** `typing()` sends `typing:true` at most this often. */
  const TYPING_EVERY_MS = 2000;
  // Shortest time between two room_state frames of one room: 20 a second,
  // the server's default --room-state-hz, and within its default frame
  // limit (30 a second) with room to spare.
  const ROOM_STATE_EVERY_MS = 50;

  /** A timer that does not keep Node alive (browsers ignore this). */
  function later(fn, ms) {
    const t = setTimeout(fn, ms);
    if (t && typeof t.unref === "function") t.unref();
    return t;
  }

  /**
   * A room this client is in (see PresenceClient#join): its counts and
   * members, kept current from the room events, and this device's state.
   */
  class Room {
    constructor(client, id, state, token) {
      /** The room id, e.g. "doc:42". */
      this.id = id;
      /** This device's state in the room, sent again with every rejoin. */
      this.state = state || {};
      /** User and device counts, as in the last room or occupancy frame. */
      this.users = 0;
      this.devices = 0;
      /** Map user -> [{device, state, joined_at}] (null in a large room, or before the first room frame). */
      this.members = null;
      /** True from the room frame that answers the join until a leave, a refusal or a dropped connection. */
      this.joined = false;
      /** The last error frame about this room ({code, message, room}), or null. */
      this.error = null;
      /** The users typing now (never this one), sorted. */
      this.typingUsers = [];
      this.onSync = () => {};
      this.onJoin = () => {};
      this.onLeave = () => {};
      this.onUpdate = () => {};
      /** Every state change of one batch (one server tick), after onUpdate for each. */
      this.onUpdates = () => {};
      this.onSignal = () => {};
      this.onOccupancy = () => {};
      this.onTyping = () => {};
      /** An error about this room (before client.onError gets it too). */
      this.onError = () => {};
      this._client = client;
      this._left = false;
      this._pending = false; // a join sent, its room frame not yet here
      this._retries = 0; // joins answered `unavailable` since the last room frame
      this._retryTimer = null;
      // The room token: a string, false (this room takes none), or null
      // (ask getToken, if the client has it, before the next join).
      this._token = token === undefined ? null : token;
      this._joinSeq = 0; // bumped by each join attempt: a late getToken answer is dropped
      this._expiredRejoin = false; // joined again after token_expired, no room frame since
      this._typers = new Map(); // user -> timer clearing it
      this._typingSentAt = 0;
      this._stateSentAt = 0; // when the last room_state went
      this._stateTimer = null; // the latest state's send, due at the next interval
    }

    /**
     * Replaces this device's state: the others get onUpdate. Call it as often
     * as you like (every mouse move): at most one room_state goes per
     * roomStateIntervalMs, the latest state, and the last one always goes.
     */
    update(state) {
      this.state = state || {};
      this._ownEntry((d) => { d.state = this.state; });
      if (this._stateTimer) return; // the latest goes with it
      const wait = this._stateSentAt + this._client.roomStateIntervalMs - Date.now();
      if (wait <= 0) return this._sendState();
      this._stateTimer = later(() => {
        this._stateTimer = null;
        this._sendState();
      }, wait);
    }

    _sendState() {
      if (!(this._pending || this.joined)) return; // the next join carries it
      this._stateSentAt = Date.now();
      this._client._send({ type: "room_state", room: this.id, state: this.state });
    }

    /** Relays any JSON to the room's other member devices (never stored). */
    signal(data) {
      if (this._pending || this.joined) this._client._send({ type: "signal", room: this.id, data });
    }

    /** Call on each keystroke: sends `{typing: true}` at most every 2 s. */
    typing() {
      const now = Date.now();
      if (now - this._typingSentAt < TYPING_EVERY_MS) return;
      this._typingSentAt = now;
      this.signal({ typing: true });
    }

    /** Stopped typing (sent, cleared the input): sends `{typing: false}`. */
    stopTyping() {
      if (!this._typingSentAt) return;
      this._typingSentAt = 0;
      this.signal({ typing: false });
    }

    /** Leaves the room: the others get room_leave; not joined again on reconnect. */
    leave() {
      if (this._left) return;
      const wasIn = this._pending || this.joined;
      this._stop();
      if (wasIn) this._client._send({ type: "leave", room: this.id });
    }

    /** Out of the room for good (left or refused). */
    _stop() {
      this._left = true;
      this.joined = false;
      this._pending = false;
      this._joinSeq += 1;
      clearTimeout(this._retryTimer);
      this._retryTimer = null;
      clearTimeout(this._stateTimer);
      this._stateTimer = null;
      if (this._client.rooms.get(this.id) === this) this._client.rooms.delete(this.id);
      this._clearTypers();
    }

    /**
     * Sends the join, with the room token. `fresh`: a token from getToken
     * even when the room has one (a rejoin after a reconnect or after
     * token_expired: the last one may have expired). Without getToken the
     * token given to join() goes again.
     */
    _sendJoin(fresh) {
      if (this._left || !this._client.connected) return;
      const c = this._client;
      const seq = ++this._joinSeq;
      const ask = c.getToken && this._token !== false && (fresh || this._token === null);
      if (!ask) return this._sendJoinFrame();
      this._pending = false; // nothing sent yet: no room_state or signal for the server
      this._askToken().then(
        (token) => {
          if (seq !== this._joinSeq) return; // left, disconnected, or a newer attempt
          this._token = token;
          if (c.connected) this._sendJoinFrame();
        },
        (e) => {
          if (seq !== this._joinSeq) return;
          // No token, no join: the room is over, and the app is told which.
          const error = this._tokenError(e);
          this._stop();
          error.willRetry = false;
          this._report(error);
        },
      );
    }

    _sendJoinFrame() {
      this._pending = true;
      // The others' state changes in one room_updates frame per server tick.
      const frame = { type: "join", room: this.id, state: this.state, batch: true };
      if (typeof this._token === "string") frame.token = this._token;
      this._client._send(frame);
    }

    /** getToken's answer for this room: a token, or false (none needed); rejects on anything else. */
    _askToken() {
      return Promise.resolve()
        .then(() => this._client.getToken(this.id))
        .then((token) => {
          if (token === false) return false;
          if (typeof token !== "string" || !token) throw new Error(`it returned ${token === "" ? "an empty string" : String(token)}, not a token`);
          return token;
        });
    }

    _tokenError(e) {
      const why = e && e.message ? e.message : String(e);
      this.error = { code: "client", message: `getToken failed for room ${this.id}: ${why}`, room: this.id };
      return this.error;
    }

    /** An error about this room: to room.onError, then client.onError. */
    _report(error) {
      this.onError(error);
      this._client.onError(error);
    }

    /** The server warned that the room token expires: a fresh one from getToken goes as room_token. */
    _tokenExpiring() {
      const c = this._client;
      if (!c.getToken || this._token === false || this._left) return;
      const seq = this._joinSeq;
      this._askToken().then(
        (token) => {
          if (seq !== this._joinSeq || !token) return; // rejoined meanwhile (with a fresh token), or left
          this._token = token;
          if (this.joined) c._send({ type: "room_token", room: this.id, token });
        },
        (e) => {
          // Still in the room until the token expires; then token_expired
          // asks getToken once more.
          if (seq === this._joinSeq) this._report(this._tokenError(e));
        },
      );
    }

    /** The connection dropped: not joined until the rejoin's room frame. */
    _disconnected() {
      this.joined = false;
      this._pending = false;
      this._joinSeq += 1;
      clearTimeout(this._retryTimer);
      this._retryTimer = null;
    }

    _ownEntry(fn) {
      const mine = this.members && this.members.get(this._client.user);
      const d = mine && mine.find((x) => x.device === this._client.device);
      if (d) fn(d);
    }

    _clearTypers() {
      if (!this._typers.size) return;
      this._typers.forEach((t) => clearTimeout(t));
      this._typers.clear();
      this._typingChanged();
    }

    _typingChanged() {
      this.typingUsers = [...this._typers.keys()].sort();
      this.onTyping(this.typingUsers.slice());
    }

    _untype(user) {
      if (!this._typers.has(user)) return;
      clearTimeout(this._typers.get(user));
      this._typers.delete(user);
      this._typingChanged();
    }

    _signalTyping(user, typing) {
      if (user === this._client.user) return; // yourself is never listed
      if (!typing) return this._untype(user);
      const isNew = !this._typers.has(user);
      clearTimeout(this._typers.get(user));
      this._typers.set(user, later(() => this._untype(user), TYPING_TTL_MS));
      if (isNew) this._typingChanged();
    }

    _frame(f) {
      switch (f.type) {
        case "room": {
          this.users = f.users;
          this.devices = f.devices;
          this.members = f.members
            ? new Map(f.members.map((m) => [m.user, m.devices.map((d) => ({ device: d.device, state: d.state, joined_at: d.joined_at }))]))
            : null;
          // The server does not echo this device's own changes: its entry shows what it set.
          this._ownEntry((d) => { d.state = this.state; });
          this.joined = true;
          this._pending = false;
          this._retries = 0;
          this._expiredRejoin = false;
          this.error = null;
          if (this.members) {
            // Typers no longer here are not typing.
            for (const u of [...this._typers.keys()]) if (!this.members.has(u)) this._untype(u);
          }
          this.onSync(this);
          break;
        }
        case "room_join": {
          const e = { user: f.user, device: f.device, state: f.state, first: f.first };
          if (this.members) {
            const list = (this.members.get(f.user) || []).filter((d) => d.device !== f.device);
            list.push({ device: f.device, state: f.state, joined_at: f.joined_at ?? Date.now() });
            this.members.set(f.user, list);
          }
          this.onJoin(e);
          break;
        }
        case "room_leave": {
          const e = { user: f.user, device: f.device, last: f.last };
          // The app's backend removed that user from the room.
          if (f.removed) e.removed = true;
          if (this.members && this.members.has(f.user)) {
            const list = this.members.get(f.user).filter((d) => d.device !== f.device);
            if (list.length) this.members.set(f.user, list);
            else this.members.delete(f.user);
          }
          if (f.last) this._untype(f.user);
          this.onLeave(e);
          break;
        }
        case "room_update":
          this.onUpdates([this._update(f)]);
          break;
        case "room_updates":
          this.onUpdates((f.updates || []).map((u) => this._update(u)));
          break;
        case "signal": {
          const e = { user: f.user, device: f.device, data: f.data };
          this.onSignal(e);
          if (f.data && typeof f.data === "object" && typeof f.data.typing === "boolean") this._signalTyping(f.user, f.data.typing);
          break;
        }
        case "occupancy":
          this.users = f.users;
          this.devices = f.devices;
          this.onOccupancy({ users: f.users, devices: f.devices });
          break;
        default:
          break;
      }
    }

    /** One member's new state: into members, then onUpdate. */
    _update(f) {
      const e = { user: f.user, device: f.device, state: f.state };
      const list = this.members && this.members.get(f.user);
      const d = list && list.find((x) => x.device === f.device);
      if (d) d.state = f.state;
      this.onUpdate(e);
      return e;
    }

    /**
     * An error frame about this room. When it put the room out, `willRetry`
     * says whether the client joins it again by itself (true) or the room is
     * over (false: not in client.rooms any more). Then room.onError and
     * client.onError get it.
     */
    _error(error) {
      this.error = error;
      const code = error.code;
      const c = this._client;
      if (ENDED.includes(code) || (this._pending && REFUSED.includes(code))) {
        // Refused (the policy, a limit), or the app's backend removed the
        // user: over for good, not joined again on reconnect. A joined room
        // answered `forbidden` is one a fresh connection token no longer
        // covers: the server made the device leave it.
        this._stop();
        error.willRetry = false;
      } else if (code === "token_expired") {
        // The room token expired with no fresh one sent: the server made
        // the device leave. One join again with a token from getToken; a
        // second expiry before that join's room frame ends the room.
        this.joined = false;
        this._pending = false;
        this._clearTypers();
        if (c.getToken && this._token !== false && !this._expiredRejoin && !this._left) {
          this._expiredRejoin = true;
          error.willRetry = true;
          this._sendJoin(true);
        } else {
          this._stop();
          error.willRetry = false;
        }
      } else if (code === "unavailable" || (this._pending && code === "rate_limited")) {
        // Redis or the app's backend did not answer: try the join again
        // after a backoff, at most maxJoinRetries times in a row.
        this.joined = false;
        this._pending = false;
        if (this._retries >= c.maxJoinRetries) {
          this._stop();
          error.willRetry = false;
        } else {
          const bound = Math.min(c.maxBackoffMs, c.minBackoffMs * 2 ** Math.min(this._retries, 16));
          this._retries += 1;
          clearTimeout(this._retryTimer);
          this._retryTimer = later(() => { this._retryTimer = null; this._sendJoin(); }, Math.round(bound / 2 + (Math.random() * bound) / 2));
          error.willRetry = true;
        }
      } else if (code === "not_in_room") {
        // The server lost the membership (it lapsed): join again.
        this.joined = false;
        this._pending = false;
        this._sendJoin();
        error.willRetry = true;
      }
      this.onError(error);
    }
  }

  class PresenceClient {
    /**
     * @param {object} options
     * @param {string|string[]} options.url  WebSocket endpoint, e.g. "wss://example.com/ws"; with
     *                                    several (one per node), each reconnect tries the next
     * @param {string} [options.user]     user id (development auth), or
     * @param {string} [options.token]    a JWT (the server reads the user from it); sent as the
     *                                    first frame, `{"type":"auth","token":...}`
     * @param {Function} [options.refreshToken]  returns a fresh JWT (or a promise of one); called
     *                                    when the server says the token expires soon
     *                                    (`auth_expiring`) and before reconnecting after the
     *                                    server closed for an expired token (4401)
     * @param {Function} [options.getToken]  `(room) => token` (or a promise of one): a room
     *                                    token from the app's backend, for rooms under
     *                                    `--room-policy token`; asked for the first join of a room
     *                                    given no token, before a room token expires
     *                                    (`room_token_expiring`), for every rejoin after a
     *                                    reconnect, and once after `token_expired`. `false`: this
     *                                    room takes no token (not asked again for it)
     * @param {number} [options.maxJoinRetries=6]   joins answered `unavailable` tried again in a
     *                                    row (with backoff) before the room is given up
     * @param {string} options.device     this device's id, stable across reconnects
     * @param {number} [options.minBackoffMs=500]    first reconnect delay (upper bound)
     * @param {number} [options.maxBackoffMs=15000]  largest reconnect delay
     * @param {Function} [options.WebSocket]         WebSocket class (default: the global one, else
     *                                              the `ws` package in Node 20)
     * @param {boolean|{delayMs?: number, document?: object, window?: object}} [options.autoPause]
     *                                    in a browser: pause() when the page has been hidden for
     *                                    delayMs (default 5000) or on pagehide, resume() when it is
     *                                    visible again (only what it paused itself)
     * @param {boolean|{idleMs?: number, document?: object, window?: object}} [options.autoAway]
     *                                    in a browser: show the user away after idleMs (default
     *                                    300000) without pointer, keyboard, touch, wheel or focus
     *                                    activity while the chosen status is online; the choice
     *                                    comes back on the next activity (see setAutoAway)
     */
    constructor(options) {
      const o = options || {};
      if (!o.url) throw new TypeError("PresenceClient: url is required");
      if (!o.device) throw new TypeError("PresenceClient: device is required");
      if (!o.user && !o.token) throw new TypeError("PresenceClient: user or token is required");
      /** Endpoints to connect to, tried in turn on reconnects. */
      this.urls = [].concat(o.url);
      /** The endpoint of the current (or last) connection. */
      this.url = this.urls[0];
      this.user = o.user || null;
      this.token = o.token || null;
      this.refreshToken = o.refreshToken || null;
      /** The server closed for an expired token: get a fresh one before reconnecting. */
      this._tokenStale = false;
      this.device = o.device;
      /** The device's kind: "web", "desktop", "mobile", "tablet", "bot" or "other" (null: the server's default, "other"). */
      this.kind = o.kind || null;
      this.minBackoffMs = o.minBackoffMs ?? 500;
      this.maxBackoffMs = o.maxBackoffMs ?? 15000;
      /** Room tokens from the app's backend: `(room) => token | false`, or a promise of one. */
      this.getToken = o.getToken || null;
      /** Shortest time between two room_state frames of one room, ms (the latest state wins). */
      this.roomStateIntervalMs = o.roomStateIntervalMs ?? ROOM_STATE_EVERY_MS;
      /** How many times in a row a join answered `unavailable` is tried again before the room is given up. */
      this.maxJoinRetries = o.maxJoinRetries ?? 6;
      this.WebSocket = o.WebSocket || defaultWebSocket();
      if (typeof this.WebSocket !== "function") {
        throw new TypeError(
          "PresenceClient: no WebSocket class in this runtime (Node before 22 has no global WebSocket). " +
            'Install the ws package (npm install ws), or pass a class: new PresenceClient({ ..., WebSocket: require("ws") })',
        );
      }
      /** Users watched; re-sent after every reconnect. */
      this.watched = new Set();
      /** The watched users whose device counts were asked for ({devices: true}). */
      this.watchedDevices = new Set();
      /**
       * The user's {status, text, until?}: this client's choice (re-sent after
       * every reconnect), or, until it makes one, the status the server holds
       * for the user (hello's `self`: a status set earlier on another device),
       * which is not re-sent. null: neither yet.
       */
      this.status = null;
      /** Whether `status` is the server's (from hello or an own record) rather than a choice. */
      this._statusFromServer = false;
      /** "idle" until connect(), then "connecting" | "open" | "reconnecting" | "closed". */
      this.state = "idle";
      /** The last hello frame: {user, device, heartbeat_ms, ttl_ms, self}. */
      this.hello = null;
      /** Reconnect attempts since the last successful hello. */
      this.attempt = 0;
      this._ws = null;
      this._timer = null;
      this._stopped = true;
      this._previousStatus = null;
      /** Map room id -> Room, for the rooms this client is in (joined again after every reconnect). */
      this.rooms = new Map();
      this.onHello = o.onHello || (() => {});
      this.onSnapshot = o.onSnapshot || (() => {});
      this.onChange = o.onChange || (() => {});
      /** This user's own record: the answer to setStatus, and a status set on another of its devices. */
      this.onSelf = o.onSelf || (() => {});
      this.onState = o.onState || (() => {});
      this.onError = o.onError || (() => {});
      /** Called with {in_ms} when the server warns that the token expires soon. */
      this.onAuthExpiring = o.onAuthExpiring || (() => {});
      /** Called with true when this device turns idle (autoAway), with false when it is active again. */
      this.onIdle = o.onIdle || (() => {});
      this._autoAway = null; // {idleMs, doc, win}: the autoAway settings, null: off
      this._aaOn = false; // its listeners are attached (between connect() and close())
      this._aaTimer = null;
      this._aaLast = 0; // the last activity seen
      this._idle = false;
      this._idleSent = false; // this device showed the user away for idleness, and that stands
      this._idleYielded = false; // idle, but another device (or the app) set a status since
      this._base = null; // the user's chosen {status, text, until?}: set here or on another device
      this._self = null; // the last own record
      if (o.autoPause) this._autoPause(o.autoPause === true ? {} : o.autoPause);
      if (o.autoAway) this.setAutoAway(o.autoAway);
    }

    /** `autoPause`: pause while the page is hidden, resume when it is back. */
    _autoPause(a) {
      const doc = a.document || (typeof document !== "undefined" ? document : null);
      const win = a.window || (typeof window !== "undefined" ? window : null);
      if (!doc || !doc.addEventListener) return;
      const delayMs = a.delayMs >= 0 ? a.delayMs : 5000;
      let timer = null;
      const away = () => {
        clearTimeout(timer);
        timer = null;
        if (this.state !== "open") return;
        this._autoPaused = true;
        this.pause();
      };
      doc.addEventListener("visibilitychange", () => {
        clearTimeout(timer);
        timer = null;
        if (doc.hidden) {
          timer = setTimeout(away, delayMs);
        } else if (this._autoPaused) {
          this._autoPaused = false;
          if (this.state === "paused") this.resume();
        }
      });
      // Leaving the page (or the bfcache): the next page view is a resume.
      if (win && win.addEventListener) win.addEventListener("pagehide", away);
    }

    /**
     * Turns automatic away on (`true`, or `{idleMs, document, window}`), changes its idle time,
     * or turns it off (`false`). On: after `idleMs` (default 300000) without activity on this
     * device (pointer, mouse, keyboard, touch, wheel or focus on `window`, a page becoming
     * visible on `document`), while the user's chosen status is `online`, the client shows the
     * user `away` (with the chosen text), and on the next activity sends the choice again.
     * `client.status` keeps the choice: the away is never re-sent as one. Without a `document`
     * or `window` (Node, unless given stand-ins) it does nothing. Off while the user shows away
     * for this device's idleness: the choice goes back at once.
     */
    setAutoAway(options) {
      const a = options === true ? {} : options;
      if (!a) {
        const wasAway = this._idleSent;
        this._aaStop();
        this._autoAway = null;
        if (wasAway) this._restoreChoice();
        return;
      }
      const doc = a.document || (typeof document !== "undefined" ? document : null);
      const win = a.window || (typeof window !== "undefined" ? window : null);
      const on = (t) => !!(t && typeof t.addEventListener === "function");
      const idleMs = a.idleMs > 0 ? a.idleMs : 300000;
      const running = this._aaOn;
      this._aaStop({ keepIdle: true });
      this._autoAway = on(doc) || on(win) ? { idleMs, doc: on(doc) ? doc : null, win: on(win) ? win : null } : null;
      if (running || (!this._stopped && this.state !== "closed")) this._aaStart();
    }

    /** True while this device has had no activity for autoAway's idleMs. */
    get idle() {
      return this._idle;
    }

    /** Listens for activity and counts from now (connect()). */
    _aaStart() {
      const a = this._autoAway;
      if (!a || this._aaOn) return;
      this._aaOn = true;
      if (!this._aaActivity) {
        this._aaActivity = () => this._activity();
        this._aaVisible = () => {
          const doc = this._autoAway && this._autoAway.doc;
          if (doc && !doc.hidden) this._activity();
        };
      }
      const opts = { passive: true, capture: true };
      const target = a.win || a.doc;
      ACTIVITY_EVENTS.forEach((ev) => target.addEventListener(ev, this._aaActivity, opts));
      if (a.doc) a.doc.addEventListener("visibilitychange", this._aaVisible);
      if (!this._idle) {
        this._aaLast = Date.now();
        this._aaArm(a.idleMs);
      }
    }

    /** Stops listening and counting (close(), or new settings); not idle any more unless `keepIdle`. */
    _aaStop(o) {
      const a = this._autoAway;
      clearTimeout(this._aaTimer);
      this._aaTimer = null;
      if (a && this._aaOn) {
        const opts = { passive: true, capture: true };
        const target = a.win || a.doc;
        ACTIVITY_EVENTS.forEach((ev) => target.removeEventListener(ev, this._aaActivity, opts));
        if (a.doc) a.doc.removeEventListener("visibilitychange", this._aaVisible);
      }
      this._aaOn = false;
      if (!(o && o.keepIdle) && this._idle) {
        this._idle = false;
        this.onIdle(false);
      }
    }

    /** Checks for idleness after `ms`: activity meanwhile only moves the check on. */
    _aaArm(ms) {
      clearTimeout(this._aaTimer);
      this._aaTimer = later(() => {
        this._aaTimer = null;
        const a = this._autoAway;
        if (!a || !this._aaOn || this._idle) return;
        const left = this._aaLast + a.idleMs - Date.now();
        if (left > 0) this._aaArm(left);
        else this._goIdle();
      }, Math.max(0, ms));
    }

    _activity() {
      if (!this._aaOn) return;
      this._aaLast = Date.now();
      if (this._idle) {
        this._idle = false;
        this._idleYielded = false;
        // Back: the choice again, over this device's away, or over another
        // device's idle away (what the user sees is someone being idle).
        if (this._idleSent || (this._self && this._isIdleAway(this._self))) this._restoreChoice();
        this.onIdle(false);
      } else if (this._self && this._isIdleAway(this._self)) {
        // Another device is idle, and the user is here: active anywhere is active.
        this._restoreChoice();
      }
      if (!this._aaTimer) this._aaArm(this._autoAway.idleMs);
    }

    _goIdle() {
      this._idle = true;
      this._idleYielded = false;
      this._sendIdleAway();
      this.onIdle(true);
    }

    /** The user's choice, as far as this client knows: a status whose `until` passed is online again. */
    _choice() {
      const b = this._base || this.status;
      if (b && b.until != null && b.until <= Date.now()) return { status: "online", text: null };
      return b;
    }

    /** An own record that is some device's idle away: away, with the chosen text, over a chosen online. */
    _isIdleAway(r) {
      const b = this._choice();
      return !!b && b.status === "online" && r.status === "away" && (r.text == null ? null : r.text) === (b.text || null);
    }

    /** Idle and the choice is online: the user shows away, with the chosen text. */
    _sendIdleAway() {
      const b = this._choice();
      if (!this._idle || this._idleYielded || this._idleSent || !b || b.status !== "online" || !this.connected) return;
      this._idleSent = true;
      this._send({ type: "status", status: "away", text: b.text || null });
    }

    /** Sends the choice again over an idle away (not a new choice: `status` is as it was). */
    _restoreChoice() {
      // Disconnected: the next hello sends it, if the away is still there.
      if (!this.connected) return;
      this._idleSent = false;
      const b = this._choice();
      if (!b) return;
      this._self = null; // until its answer: no second restore on the next pointermove
      this._send({ type: "status", status: b.status, text: b.text || null });
    }

    /**
     * An own record (hello's `self`, or a presence frame): the user's choice
     * follows it unless it is an idle away. A status set elsewhere while this
     * device is idle wins: it is not overwritten by this device's away.
     */
    _ownRecord(r) {
      if (!r || !STATUSES.includes(r.status)) return;
      this._self = r;
      if (this._isIdleAway(r)) return;
      this._base = { status: r.status, text: r.text == null ? null : r.text };
      if (r.until != null) this._base.until = r.until;
      this._idleSent = false;
      if (this._idle) this._idleYielded = true;
    }

    /** Opens the connection (and keeps it open until close()); a no-op while open or opening. */
    connect() {
      if (this._ws && this._ws.readyState <= 1) return;
      this._stopped = false;
      clearTimeout(this._timer);
      this._timer = null;
      this._aaStart();
      this._open();
    }

    /** Closes for good: no reconnect until connect() is called again. */
    close() {
      this._stopped = true;
      clearTimeout(this._timer);
      this._timer = null;
      const ws = this._ws;
      this._ws = null;
      if (ws && ws.readyState <= 1) ws.close(1000, "bye");
      this.rooms.forEach((r) => r._disconnected());
      this._aaStop();
      this._setState("closed", { code: 1000, reason: "closed by client", willRetry: false });
    }

    /**
     * Steps away without leaving, for an app going to the background: the
     * server keeps this device present (and in its rooms) for a grace it
     * bounds (`--pause-grace-ms`; at most `options.graceMs` when given),
     * then the socket closes and the client does not reconnect until
     * resume(). A resume() within the grace shows watchers and room members
     * nothing at all; past it the device leaves once, as after a lost
     * connection. Resolves with the grace granted in ms (0 when there was
     * no open connection to keep). onState("paused", {graceMs}) follows.
     */
    pause(options) {
      const graceMs = options && options.graceMs;
      clearTimeout(this._timer);
      this._timer = null;
      this._stopped = true;
      const ws = this._ws;
      if (!ws || ws.readyState !== 1 || this.state !== "open") {
        this._ws = null;
        if (ws && ws.readyState <= 1) ws.close(1000, "bye");
        this.rooms.forEach((r) => r._disconnected());
        this._setState("paused", { graceMs: 0 });
        return Promise.resolve(0);
      }
      return new Promise((resolve) => {
        this._pausing = (granted) => {
          this._pausing = null;
          this._setState("paused", { graceMs: granted });
          resolve(granted);
        };
        const frame = { type: "pause" };
        if (graceMs > 0) frame.grace_ms = Math.round(graceMs);
        ws.send(JSON.stringify(frame));
      });
    }

    /** Comes back after pause(): reconnects, watches and rejoins as after any reconnect. */
    resume() {
      // A resume before the pause's close came: that pause is over.
      if (this._pausing) this._pausing(this._pausedMs || 0);
      this._pausedMs = 0;
      this.attempt = 0;
      this.connect();
    }

    /**
     * Watches users: answered by onSnapshot, then onChange for each transition.
     * With `{devices: true}`, onChange also fires whenever one of these users'
     * device count changes (a second tab opening or closing), with the same
     * status; kept until the users are unwatched.
     */
    watch(users, options) {
      const list = [].concat(users).filter(Boolean);
      if (!list.length) return;
      const devices = !!(options && options.devices);
      list.forEach((u) => {
        this.watched.add(u);
        if (devices) this.watchedDevices.add(u);
      });
      this._send(devices ? { type: "watch", users: list, devices: true } : { type: "watch", users: list });
    }

    /** Stops watching users. */
    unwatch(users) {
      const list = [].concat(users).filter(Boolean);
      if (!list.length) return;
      list.forEach((u) => {
        this.watched.delete(u);
        this.watchedDevices.delete(u);
      });
      this._send({ type: "unwatch", users: list });
    }

    /**
     * Asks for a fresh snapshot of every watched user. Transitions are
     * pushed, but a second device arriving (or one of several leaving) is no
     * transition, so without `{devices: true}` device counts in onChange
     * records can fall behind; watch with it, or call this now and then, if
     * you show them. (A watch naming users already watched reads only the
     * new ones, so the refresh lets go of the users and watches them again;
     * events between the two are in the snapshot.)
     */
    refresh() {
      if (!this.watched.size) return;
      this._send({ type: "unwatch", users: [...this.watched] });
      this._sendWatches();
    }

    /** Sends the watch list again after a jittered backoff, longer each time until a snapshot comes. */
    _retryWatches() {
      if (this._watchRetryTimer) return;
      const retries = this._watchRetries || 0;
      const bound = Math.min(this.maxBackoffMs, this.minBackoffMs * 2 ** Math.min(retries, 16));
      this._watchRetries = retries + 1;
      const ws = this._ws;
      this._watchRetryTimer = later(() => {
        this._watchRetryTimer = null;
        // A reconnect sends the list anyway.
        if (this._ws === ws && ws && ws.readyState === 1) this._sendWatches();
      }, Math.round(bound / 2 + (Math.random() * bound) / 2));
    }

    /** Sends the watch list: users with device counts in a frame of their own. */
    _sendWatches() {
      const plain = [...this.watched].filter((u) => !this.watchedDevices.has(u));
      if (plain.length) this._send({ type: "watch", users: plain });
      if (this.watchedDevices.size) this._send({ type: "watch", users: [...this.watchedDevices], devices: true });
    }

    /**
     * Sets the status for all of this user's devices: "online", "away",
     * "busy" or "invisible", with optional text: `setStatus("away", "lunch")`
     * or `setStatus("busy", { text, until })`, where `until` (epoch ms or a
     * Date, at most 30 days ahead) is when the server turns it back to
     * "online" and clears the text. If the server refuses it (error
     * `invalid_status`) the client falls back to the previous choice, so a
     * reconnect does not send the refused one again, and onError gets the
     * error with `status` naming the refused choice.
     */
    setStatus(status, options) {
      if (!STATUSES.includes(status)) throw new RangeError(`PresenceClient: unknown status ${status}`);
      const o = options !== null && typeof options === "object" ? options : { text: options };
      this._previousStatus = { status: this.status, fromServer: this._statusFromServer, base: this._base };
      this._statusFromServer = false;
      this.status = { status, text: o.text ? String(o.text) : null };
      if (o.until != null) this.status.until = +o.until;
      // A choice made while idle stands: no away over it until the next idleness.
      this._base = this.status;
      this._idleSent = false;
      if (this._idle) this._idleYielded = true;
      this._send({ type: "status", ...this.status });
    }

    /** The chosen status to re-send: null once its `until` has passed (the server reset it), or when it is the server's. */
    _statusToResend() {
      if (this.status && this.status.until != null && this.status.until <= Date.now()) this.status = null;
      return this._statusFromServer ? null : this.status;
    }

    /**
     * The status frame a hello is followed by: the choice to re-send, but
     * with autoAway, what this device's idleness asks for instead. Idle: the
     * away (unless already shown, or another device set a status since);
     * active again after an away this device showed: the choice back. Never
     * the away as a choice: `status` is untouched.
     */
    _helloStatus(self) {
      const choice = this._statusToResend();
      const sent = this._idleSent;
      const yielded = this._idleYielded;
      if (self) this._ownRecord(self);
      // A status other than this device's away yields only when there was
      // an away to yield (idle since the connection dropped: none yet).
      if (!sent) this._idleYielded = yielded;
      const b = this._choice();
      const showsIdle = !!self && this._isIdleAway(self);
      if (this._idle && !this._idleYielded && b && b.status === "online" && (!choice || choice.status === "online")) {
        this._idleSent = true;
        return showsIdle ? null : { status: "away", text: b.text || null };
      }
      if (!this._idle && this._idleSent) {
        this._idleSent = false;
        if (showsIdle) return { status: b.status, text: b.text || null };
      }
      return choice;
    }

    /** Takes the user's own record as `status`, unless this client has a choice of its own. */
    _adoptOwn(record) {
      if (this.status && !this._statusFromServer) return;
      if (!STATUSES.includes(record.status)) return;
      // With autoAway, an idle away is no choice: `status` keeps the user's.
      if (this._autoAway && this._isIdleAway(record)) return;
      this.status = { status: record.status, text: record.text == null ? null : record.text };
      if (record.until != null) this.status.until = record.until;
      this._statusFromServer = true;
    }

    /**
     * Joins a room (now, or once connected) with this device's state, and
     * again after every reconnect with its last state. Joining a room this
     * client is in already replaces the state and returns the same Room.
     * `token`: the room token for this join (`--room-policy token`); without
     * one the client asks getToken, if it has it; `false`: the room takes no
     * token, getToken is never asked for it.
     */
    join(room, options) {
      const o = options || {};
      const state = o.state || {};
      const token = o.token === undefined || o.token === null || o.token === "" ? undefined : o.token;
      if (token !== undefined && token !== false && typeof token !== "string") {
        throw new TypeError("PresenceClient: a room token is a string (or false: the room takes none)");
      }
      let r = this.rooms.get(room);
      if (r) {
        r.state = state;
        if (token !== undefined) r._token = token;
      } else {
        r = new Room(this, room, state, token);
        this.rooms.set(room, r);
      }
      r._sendJoin();
      return r;
    }

    /** Refreshes the lease explicitly (pongs and other frames do too). */
    heartbeat() {
      this._send({ type: "heartbeat" });
    }

    /** True when frames can be sent now. */
    get connected() {
      return this.state === "open";
    }

    _open() {
      // Each reconnect after a failure moves on to the next node, if several.
      if (this.attempt > 0) this.url = this.urls[this.attempt % this.urls.length];
      const params = new URLSearchParams({ device: this.device });
      // A token never goes into the URL (proxies and access logs keep
      // URLs): it is the first frame, sent once the socket is open.
      if (!this.token) params.set("user", this.user);
      // The chosen status travels with the handshake too, so that a device
      // coming back invisible never shows online, even for a moment.
      if (this._statusToResend()) params.set("status", this.status.status);
      if (this.kind) params.set("kind", this.kind);
      const sep = this.url.includes("?") ? "&" : "?";
      let ws;
      this._setState(this.attempt ? "reconnecting" : "connecting", { attempt: this.attempt, url: this.url });
      try {
        ws = new this.WebSocket(`${this.url}${sep}${params}`);
      } catch (e) {
        // A malformed URL throws at once: retrying will not help.
        this._stopped = true;
        this.onError({ code: "client", message: String(e && e.message ? e.message : e) });
        this._setState("closed", { code: 0, reason: String(e), willRetry: false });
        return;
      }
      this._ws = ws;
      // A failed connection is followed by its close, which retries; the ws
      // package (Node 20) would throw an error event nobody listens to.
      ws.onerror = () => {};
      ws.onopen = () => {
        if (this._ws !== ws || !this.token) return;
        this._currentToken().then(
          (token) => {
            if (this._ws === ws && ws.readyState === 1) ws.send(JSON.stringify({ type: "auth", token }));
          },
          (e) => {
            this.onError({ code: "client", message: `refreshToken failed: ${e && e.message ? e.message : e}` });
            if (this._ws === ws) ws.close(1000, "no token");
          },
        );
      };
      ws.onmessage = (ev) => {
        if (this._ws !== ws) return;
        let frame;
        try {
          frame = JSON.parse(ev.data);
        } catch (e) {
          this.onError({ code: "client", message: "server sent a frame that is not JSON" });
          return;
        }
        this._frame(frame);
      };
      ws.onclose = (ev) => {
        if (this._ws !== ws) return; // superseded by close() or a newer connection
        this._ws = null;
        // 4001: the same device connected again elsewhere and the newer
        // connection won; coming back would only push that one out. 1008:
        // policy (a refused or missing token, too many devices, a flood):
        // the same again would be refused again. 4401 (token expired):
        // only a fresh token from refreshToken() can help.
        if (FINAL_CLOSE_CODES.includes(ev.code) || (ev.code === 4401 && !this.refreshToken)) this._stopped = true;
        this.rooms.forEach((r) => r._disconnected());
        if (this._pausing) {
          // Closed by pause(): with 1000 "paused" the server kept the
          // device; anything else (the lease taken, Redis down) kept nothing.
          this._pausing(ev.code === 1000 && this._pausedMs ? this._pausedMs : 0);
          this._pausedMs = 0;
          return;
        }
        if (ev.code === 4401) this._tokenStale = true;
        this._scheduleReconnect(ev.code, ev.reason, retryHint(ev.code, ev.reason));
      };
    }

    _scheduleReconnect(code, reason, hintMs) {
      if (this._stopped) {
        this._setState("closed", { code, reason, willRetry: false });
        return;
      }
      // Full jitter: a random delay between 0 and the exponential bound, so
      // that the clients of a node that went away do not all come back at
      // once. A node that shed load (1013) names the shortest wait; the
      // client waits that plus as much again at random.
      const bound = Math.min(this.maxBackoffMs, this.minBackoffMs * 2 ** Math.min(this.attempt, 16));
      const delay = hintMs > 0 ? Math.round(hintMs + Math.random() * hintMs) : Math.round(Math.random() * bound);
      this.attempt += 1;
      this._setState("reconnecting", { code, reason, willRetry: true, delayMs: delay, attempt: this.attempt });
      this._timer = setTimeout(() => {
        this._timer = null;
        if (!this._stopped) this._open();
      }, delay);
    }

    /** The token to authenticate with: a fresh one after the last expired. */
    async _currentToken() {
      if (this._tokenStale && this.refreshToken) {
        this.token = await this.refreshToken();
        this._tokenStale = false;
      }
      return this.token;
    }

    /** The server warned that the token expires: fetch a fresh one and send it. */
    async _renewToken(f) {
      this.onAuthExpiring({ in_ms: f.in_ms });
      if (!this.refreshToken) return;
      const ws = this._ws;
      try {
        const token = await this.refreshToken();
        if (!token) return;
        this.token = token;
        if (this._ws === ws && ws && ws.readyState === 1) ws.send(JSON.stringify({ type: "auth", token }));
      } catch (e) {
        this.onError({ code: "client", message: `refreshToken failed: ${e && e.message ? e.message : e}` });
      }
    }

    _setState(state, info) {
      this.state = state;
      this.onState(state, info || {});
    }

    _send(frame) {
      const ws = this._ws;
      if (ws && ws.readyState === 1 && this.state === "open") ws.send(JSON.stringify(frame));
      // Otherwise it is sent (from this.status / this.watched) once open.
    }

    _frame(f) {
      switch (f.type) {
        case "hello":
          this.hello = f;
          // With a token, the server says who we are.
          if (f.user) this.user = f.user;
          this.attempt = 0;
          // A choice of this client's is sent again, and its answer reaches
          // onSelf; otherwise the status the user has (set on another
          // device, earlier) is this client's from the start.
          const choice = this._helloStatus(f.self);
          if (!choice && f.self) this._adoptOwn(f.self);
          // The choice goes first, before anything the callbacks send (a
          // watch of oneself would otherwise be answered with the old status).
          this.state = "open";
          if (choice) this._send({ type: "status", ...choice });
          this._setState("open", { hello: f, url: this.url });
          this.onHello(f);
          if (!choice && f.self) this.onSelf(f.self);
          this._sendWatches();
          // Back in every room, with its last state (the others see no leave
          // and join when this comes within the membership's deadline), and
          // a fresh room token from getToken (the last may have expired).
          this.rooms.forEach((r) => r._sendJoin(true));
          break;
        case "paused":
          // The server kept the device for grace_ms; its close follows.
          this._pausedMs = f.grace_ms || 0;
          break;
        case "auth_expiring":
          this._renewToken(f);
          break;
        case "room_token_expiring": {
          const r = this.rooms.get(f.room);
          if (r) r._tokenExpiring(f);
          break;
        }
        case "snapshot":
          this._watchRetries = 0;
          this.onSnapshot(f.presence || []);
          break;
        case "presence": {
          const { type, ...record } = f;
          // My own record (the answer to setStatus, or a change made on
          // another of my devices) is not a contact's transition.
          if (this.user !== null && record.user === this.user) {
            this._adoptOwn(record);
            this._ownRecord(record);
            this.onSelf(record);
          } else this.onChange(record);
          break;
        }
        case "room":
        case "room_join":
        case "room_leave":
        case "room_update":
        case "room_updates":
        case "signal":
        case "occupancy": {
          const r = this.rooms.get(f.room);
          if (r) r._frame(f);
          break;
        }
        case "error": {
          const error = { code: f.code, message: f.message };
          if (f.room !== undefined) {
            error.room = f.room;
            const r = this.rooms.get(f.room);
            if (r) r._error(error);
          }
          // Redis could not answer (the server tried for a few seconds):
          // a watch among the requests may have been dropped. Watching
          // again after a backoff is harmless (users still watched are
          // not read again) and brings back the dropped ones.
          if (f.code === "unavailable" && f.room === undefined && this.watched.size) this._retryWatches();
          if (f.code === "invalid_status" && this.status) {
            error.status = this.status.status;
            const previous = this._previousStatus || { status: null, fromServer: false };
            this.status = previous.status;
            this._statusFromServer = previous.fromServer;
            this._base = previous.base || null;
            this._previousStatus = null;
          }
          this.onError(error);
          break;
        }
        default:
          // Newer servers may add frame types; ignore what we do not know.
          break;
      }
    }
  }

  PresenceClient.STATUSES = STATUSES;
  PresenceClient.FINAL_CLOSE_CODES = FINAL_CLOSE_CODES;
  PresenceClient.Room = Room;
  global.PresenceClient = PresenceClient;
  if (typeof module !== "undefined" && module.exports) module.exports = PresenceClient;
})(typeof window !== "undefined" ? window : globalThis);
