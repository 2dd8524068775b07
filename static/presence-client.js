// presence-client.js: a small, dependency-free client for presence-server.
// Works in browsers (a plain <script>, or as a CommonJS module) and in Node 22+
// (global WebSocket) or with any WebSocket class passed as `WebSocket`.
//
//   const client = new PresenceClient({ url: "ws://host:8080/ws", user: "alice", device: "tab-1" });
//   // With JWT auth: the token goes as the first frame, never into the URL,
//   // and refreshToken() is asked for a fresh one before it expires.
//   const client = new PresenceClient({ url, device: "tab-1", token, refreshToken: async () => fetchToken() });
//   client.onSnapshot = (records) => ...;       // answer to watch(): current records
//   client.onChange = (record) => ...;          // live transition of a watched user
//   client.onState = (state, info) => ...;      // "connecting" | "open" | "reconnecting" | "closed"
//   client.onError = (error) => ...;            // {code, message} error frames (session goes on)
//   client.connect();
//   client.watch(["bob", "carol"]);             // may be called before the connection is open
//   client.watch(["dave"], { devices: true });  // also onChange when dave's device count changes
//   client.setStatus("away", "in a meeting");
//
// The client reconnects by itself with exponential backoff and full jitter,
// and after each reconnect re-sends the chosen status and the watch list, so
// an app only has to keep rendering what onSnapshot and onChange hand it.
(function (global) {
  "use strict";

  /** Statuses a client may choose. `invisible` is refused by servers without privacy support. */
  const STATUSES = ["online", "away", "busy", "invisible"];

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
     * @param {string} options.device     this device's id, stable across reconnects
     * @param {number} [options.minBackoffMs=500]    first reconnect delay (upper bound)
     * @param {number} [options.maxBackoffMs=15000]  largest reconnect delay
     * @param {Function} [options.WebSocket]         WebSocket class (default: the global one)
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
      this.minBackoffMs = o.minBackoffMs ?? 500;
      this.maxBackoffMs = o.maxBackoffMs ?? 15000;
      this.WebSocket = o.WebSocket || global.WebSocket;
      /** Users watched; re-sent after every reconnect. */
      this.watched = new Set();
      /** The watched users whose device counts were asked for ({devices: true}). */
      this.watchedDevices = new Set();
      /** The chosen {status, text}, re-sent after every reconnect (null: the server's default). */
      this.status = null;
      /** "idle" until connect(), then "connecting" | "open" | "reconnecting" | "closed". */
      this.state = "idle";
      /** The last hello frame: {user, device, heartbeat_ms, ttl_ms}. */
      this.hello = null;
      /** Reconnect attempts since the last successful hello. */
      this.attempt = 0;
      this._ws = null;
      this._timer = null;
      this._stopped = true;
      this._previousStatus = null;
      this.onHello = o.onHello || (() => {});
      this.onSnapshot = o.onSnapshot || (() => {});
      this.onChange = o.onChange || (() => {});
      this.onState = o.onState || (() => {});
      this.onError = o.onError || (() => {});
      /** Called with {in_ms} when the server warns that the token expires soon. */
      this.onAuthExpiring = o.onAuthExpiring || (() => {});
    }

    /** Opens the connection (and keeps it open until close()); a no-op while open or opening. */
    connect() {
      if (this._ws && this._ws.readyState <= 1) return;
      this._stopped = false;
      clearTimeout(this._timer);
      this._timer = null;
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
      this._setState("closed", { code: 1000, reason: "closed by client", willRetry: false });
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

    /** Sends the watch list: users with device counts in a frame of their own. */
    _sendWatches() {
      const plain = [...this.watched].filter((u) => !this.watchedDevices.has(u));
      if (plain.length) this._send({ type: "watch", users: plain });
      if (this.watchedDevices.size) this._send({ type: "watch", users: [...this.watchedDevices], devices: true });
    }

    /**
     * Sets the status for all of this user's devices: "online", "away",
     * "busy" or "invisible", with optional text. If the server refuses it
     * (error `invalid_status`) the client falls back to the previous choice,
     * so a reconnect does not send the refused one again, and onError gets
     * the error with `status` naming the refused choice.
     */
    setStatus(status, text) {
      if (!STATUSES.includes(status)) throw new RangeError(`PresenceClient: unknown status ${status}`);
      this._previousStatus = this.status;
      this.status = { status, text: text ? String(text) : null };
      this._send({ type: "status", ...this.status });
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
      if (this.status) params.set("status", this.status.status);
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
        if (ev.code === 4001) {
          // The same device connected again elsewhere and the newer
          // connection won: coming back would only push that one out.
          this._stopped = true;
        }
        // The token expired (4401): a reconnect needs a fresh one.
        if (ev.code === 4401) this._tokenStale = true;
        this._scheduleReconnect(ev.code, ev.reason);
      };
    }

    _scheduleReconnect(code, reason) {
      if (this._stopped) {
        this._setState("closed", { code, reason, willRetry: false });
        return;
      }
      // Full jitter: a random delay up to the exponential bound, so that the
      // clients of a node that went away do not all come back at once.
      const bound = Math.min(this.maxBackoffMs, this.minBackoffMs * 2 ** Math.min(this.attempt, 16));
      const delay = Math.round(bound / 2 + (Math.random() * bound) / 2);
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
          this._setState("open", { hello: f, url: this.url });
          this.onHello(f);
          if (this.status) this._send({ type: "status", ...this.status });
          this._sendWatches();
          break;
        case "auth_expiring":
          this._renewToken(f);
          break;
        case "snapshot":
          this.onSnapshot(f.presence || []);
          break;
        case "presence": {
          const { type, ...record } = f;
          this.onChange(record);
          break;
        }
        case "error": {
          const error = { code: f.code, message: f.message };
          if (f.code === "invalid_status" && this.status) {
            error.status = this.status.status;
            this.status = this._previousStatus;
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
  global.PresenceClient = PresenceClient;
  if (typeof module !== "undefined" && module.exports) module.exports = PresenceClient;
})(typeof window !== "undefined" ? window : globalThis);
