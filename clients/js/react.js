// presence-client/react: React hooks (React 18+) over a PresenceClient.
//
//   <PresenceProvider client={client}> ... </PresenceProvider>
//   const [bob, carol] = usePresence(["bob", "carol"]);     // records, live (null until known)
//   const { record, setStatus } = useSelf();                 // own record
//   const chat = useRoom("chat:1", { state: { page: 1 } });  // members, typingUsers, typing()...
//   const { users, devices } = useOccupancy("chat:1");      // counts only
//
// Components read through useSyncExternalStore from one store per client,
// which keeps a listener set per user and per room: a frame about bob
// re-renders the components that show bob and no others, and a frame about
// one room only the components in that room. Snapshots are immutable and
// replaced only when they change, so an unchanged one never re-renders.
//
// Hooks join on mount and leave on unmount; components using the same room
// (or user) share one join (or watch), counted, and the last unmount leaves
// (or unwatches) a tick later, so that a remount in the same tick (React's
// StrictMode) causes no leave and join for the others.
"use strict";

const React = require("react");

const Context = React.createContext(null);

/** The store of each client, created on first use. */
const STORES = new WeakMap();
/** Where a client's or room's callback taps are kept (not enumerable). */
const TAPS = Symbol("presence-client/react taps");
/** The snapshot of a room before its join is sent. */
const NOT_JOINED = Object.freeze({ members: null, users: 0, devices: 0, typingUsers: Object.freeze([]), joined: false, error: null });
const NO_COUNTS = Object.freeze({ users: 0, devices: 0 });

/**
 * Listens to `obj[name]` (a callback the client calls, such as onChange)
 * beside the app's own handler: the app may still set it, before or after,
 * and its handler runs first. Returns the function that stops listening.
 */
function tap(obj, name, listener) {
  let taps = obj[TAPS];
  if (!taps) {
    taps = {};
    Object.defineProperty(obj, TAPS, { value: taps });
  }
  let t = taps[name];
  if (!t) {
    t = { app: obj[name], listeners: new Set(), busy: false };
    const slot = t;
    const call = function (...args) {
      // A handler that chains to what it read back (prev = client.onChange)
      // calls this again: the listeners run once, after it.
      if (slot.busy) return undefined;
      slot.busy = true;
      try {
        return typeof slot.app === "function" ? slot.app.apply(this, args) : undefined;
      } finally {
        slot.busy = false;
        slot.listeners.forEach((l) => l(...args));
      }
    };
    Object.defineProperty(obj, name, {
      configurable: true,
      enumerable: true,
      get: () => call,
      set: (fn) => { slot.app = fn; },
    });
    taps[name] = t;
  }
  t.listeners.add(listener);
  return () => t.listeners.delete(listener);
}

/** True when two flat records (presence records, counts) hold the same values. */
function sameRecord(a, b) {
  if (a === b) return true;
  if (!a || !b) return false;
  const ka = Object.keys(a);
  if (ka.length !== Object.keys(b).length) return false;
  return ka.every((k) => Object.is(a[k], b[k]) || JSON.stringify(a[k]) === JSON.stringify(b[k]));
}

/** Runs `fn` a tick later (after React's StrictMode remount). */
function soon(fn) {
  setTimeout(fn, 0);
}

/** A room the hooks are in: the client's Room, who uses it, and its snapshots. */
class RoomEntry {
  constructor(store, id, options) {
    this.id = id;
    this.refs = 0;
    this.listeners = new Set();
    /** The latest options of each subscriber (its getToken and onSignal). */
    this.options = new Map();
    this.snapshot = NOT_JOINED;
    this.counts = NO_COUNTS;
    const o = options || {};
    const c = store.client;
    this.room = c.join(id, { state: o.state, token: o.token });
    const changed = () => this.refresh();
    this.untaps = ["onSync", "onJoin", "onLeave", "onUpdate", "onOccupancy", "onTyping", "onError"].map((n) => tap(this.room, n, changed));
    this.untaps.push(tap(this.room, "onSignal", (e) => this.options.forEach((opt) => opt.onSignal && opt.onSignal(e))));
    this.refresh();
  }

  /** The getToken of the newest subscriber that gave one. */
  getToken() {
    let found = null;
    this.options.forEach((o) => { if (o.getToken) found = o.getToken; });
    return found;
  }

  /** Takes a fresh snapshot of the Room; listeners hear of it only when it changed. */
  refresh() {
    const r = this.room;
    // Sorted by user, as the room frame lists them (the Room adds joiners at the end).
    const members = r.members
      ? new Map([...r.members].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
        .map(([user, devices]) => [user, Object.freeze(devices.map((d) => Object.freeze({ ...d })))]))
      : null;
    // The Room's counts are the last room frame's; a listed room's members are newer.
    let users = r.users;
    let devices = r.devices;
    if (members) {
      users = members.size;
      devices = 0;
      members.forEach((list) => { devices += list.length; });
    }
    const next = { members, users, devices, typingUsers: r.typingUsers, joined: r.joined, error: r.error };
    const prev = this.snapshot;
    if (prev.joined === next.joined && prev.error === next.error && prev.users === users && prev.devices === devices &&
        prev.typingUsers === next.typingUsers && sameMembers(prev.members, members)) return;
    this.snapshot = Object.freeze(next);
    if (this.counts.users !== users || this.counts.devices !== devices) this.counts = Object.freeze({ users, devices });
    this.listeners.forEach((l) => l());
  }
}

function sameMembers(a, b) {
  if (a === b) return true;
  if (!a || !b || a.size !== b.size) return false;
  for (const [user, list] of a) {
    const other = b.get(user);
    if (!other || other.length !== list.length) return false;
    if (list.some((d, i) => !sameRecord(d, other[i]))) return false;
  }
  return true;
}

/** What the hooks of one client share: records by user, rooms by id, and who listens to each. */
class Store {
  constructor(client) {
    this.client = client;
    /** user -> the latest record (frozen; replaced only when it changed). */
    this.records = new Map();
    /** user -> listeners of that user's record. */
    this.userListeners = new Map();
    /** user -> components using it; the hooks watch a user while it is used. */
    this.watchRefs = new Map();
    /** The users the hooks watch (not those the app watched itself). */
    this.owned = new Set();
    /** room id -> RoomEntry, while a component uses the room. */
    this.rooms = new Map();
    /** Listeners waiting for hello to name this user (token auth). */
    this.selfWaiting = new Set();
    /** Listeners of the client's idleness (autoAway). */
    this.idleListeners = new Set();
    this.attached = false;
    this.tokensDispatched = false;
  }

  /** Listens to the client's callbacks (once, on the first subscription). */
  attach() {
    if (this.attached) return;
    this.attached = true;
    const c = this.client;
    tap(c, "onSnapshot", (records) => records.forEach((r) => this.record(r)));
    tap(c, "onChange", (r) => this.record(r));
    tap(c, "onSelf", (r) => this.record(r));
    tap(c, "onIdle", () => this.idleListeners.forEach((l) => l()));
    // A dropped connection puts every room out until its rejoin: no room callback says so.
    tap(c, "onState", () => this.rooms.forEach((e) => e.refresh()));
    tap(c, "onHello", () => {
      if (!c.user || !this.selfWaiting.size) return;
      const waiting = [...this.selfWaiting];
      this.selfWaiting.clear();
      waiting.forEach((w) => { w.unsubscribe = this.subscribeUsers([c.user], w.listener); w.listener(); });
    });
  }

  record(r) {
    if (!r || typeof r.user !== "string") return;
    if (sameRecord(this.records.get(r.user), r)) return;
    if (!this.watchRefs.has(r.user)) return; // a user the app watches, no component shows
    this.records.set(r.user, Object.freeze({ ...r }));
    const ls = this.userListeners.get(r.user);
    if (ls) ls.forEach((l) => l());
  }

  subscribeUsers(users, listener) {
    this.attach();
    const c = this.client;
    const added = [];
    const again = [];
    for (const u of users) {
      let ls = this.userListeners.get(u);
      if (!ls) this.userListeners.set(u, (ls = new Set()));
      ls.add(listener);
      const n = (this.watchRefs.get(u) || 0) + 1;
      this.watchRefs.set(u, n);
      if (n > 1 || this.owned.has(u)) continue;
      if (!c.watched.has(u)) {
        this.owned.add(u);
        added.push(u);
      } else if (!this.records.has(u)) {
        again.push(u);
      }
    }
    // With device counts, so that records follow a second tab too.
    if (added.length) c.watch(added, { devices: true });
    if (again.length) {
      // Watched by the app already: a watch of those alone would read nothing, so they
      // are watched again (as the app chose) for a snapshot, and stay the app's.
      const devices = again.filter((u) => c.watchedDevices.has(u));
      c.unwatch(again);
      const plain = again.filter((u) => !devices.includes(u));
      if (plain.length) c.watch(plain);
      if (devices.length) c.watch(devices, { devices: true });
    }
    return () => {
      for (const u of users) {
        const ls = this.userListeners.get(u);
        if (ls) ls.delete(listener);
        this.watchRefs.set(u, this.watchRefs.get(u) - 1);
      }
      soon(() => {
        const gone = users.filter((u) => this.watchRefs.get(u) === 0);
        gone.forEach((u) => {
          this.watchRefs.delete(u);
          this.userListeners.delete(u);
          this.records.delete(u);
        });
        const mine = gone.filter((u) => this.owned.delete(u));
        if (mine.length) this.client.unwatch(mine);
      });
    };
  }

  /** This device's idleness (the client's autoAway). */
  subscribeIdle(listener) {
    this.attach();
    this.idleListeners.add(listener);
    return () => this.idleListeners.delete(listener);
  }

  /** This user's own record: watched like any other, once hello has named the user. */
  subscribeSelf(listener) {
    this.attach();
    if (this.client.user) return this.subscribeUsers([this.client.user], listener);
    const w = { listener, unsubscribe: null };
    this.selfWaiting.add(w);
    return () => {
      this.selfWaiting.delete(w);
      if (w.unsubscribe) w.unsubscribe();
    };
  }

  subscribeRoom(id, options, listener) {
    this.attach();
    // Before the join: it asks getToken.
    if (options && options.getToken) this.dispatchTokens();
    let e = this.rooms.get(id);
    if (!e) {
      e = new RoomEntry(this, id, options);
      this.rooms.set(id, e);
    }
    e.refs += 1;
    e.listeners.add(listener);
    e.options.set(listener, options || {});
    return () => {
      e.refs -= 1;
      e.listeners.delete(listener);
      e.options.delete(listener);
      soon(() => {
        if (e.refs > 0 || this.rooms.get(id) !== e) return;
        this.rooms.delete(id);
        e.untaps.forEach((u) => u());
        e.room.leave();
      });
    };
  }

  /**
   * Routes the client's getToken through the hooks, so that each room may
   * bring its own: a room's getToken from useRoom, else the client's own,
   * else the token the room was joined with.
   */
  dispatchTokens() {
    if (this.tokensDispatched) return;
    this.tokensDispatched = true;
    const c = this.client;
    const own = c.getToken;
    c.getToken = (room) => {
      const e = this.rooms.get(room);
      const fn = e && e.getToken();
      if (fn) return fn(room);
      if (own) return own(room);
      const r = c.rooms.get(room);
      return r && typeof r._token === "string" ? r._token : false;
    };
  }
}

function storeOf(client) {
  let s = STORES.get(client);
  if (!s) STORES.set(client, (s = new Store(client)));
  return s;
}

function useStore() {
  const client = React.useContext(Context);
  if (!client) throw new Error("presence-client/react: no <PresenceProvider client={...}> above this component");
  return storeOf(client);
}

/** Makes `client` the one the hooks below it use. The app connects and closes it. */
function PresenceProvider(props) {
  return React.createElement(Context.Provider, { value: props.client }, props.children);
}

/** The PresenceClient of the nearest PresenceProvider. */
function usePresenceClient() {
  return useStore().client;
}

/**
 * The records of `users`, in that order (null until the first snapshot),
 * kept live; watched while used. Re-renders only when one of them changes.
 */
function usePresence(users) {
  const store = useStore();
  const list = [].concat(users == null ? [] : users).filter(Boolean);
  const key = JSON.stringify(list);
  const subscribe = React.useCallback((l) => store.subscribeUsers(JSON.parse(key), l), [store, key]);
  const cache = React.useRef(null);
  const getSnapshot = () => {
    const next = list.map((u) => store.records.get(u) || null);
    const prev = cache.current;
    if (prev && prev.key === key && prev.value.every((r, i) => r === next[i])) return prev.value;
    cache.current = { key, value: Object.freeze(next) };
    return cache.current.value;
  };
  return React.useSyncExternalStore(subscribe, getSnapshot, getSnapshot);
}

/** This user's own record (null until known), this device's idleness (autoAway) and setStatus. */
function useSelf() {
  const store = useStore();
  const subscribe = React.useCallback((l) => store.subscribeSelf(l), [store]);
  const getSnapshot = () => (store.client.user && store.records.get(store.client.user)) || null;
  const record = React.useSyncExternalStore(subscribe, getSnapshot, getSnapshot);
  const subscribeIdle = React.useCallback((l) => store.subscribeIdle(l), [store]);
  const getIdle = () => !!store.client.idle;
  const idle = React.useSyncExternalStore(subscribeIdle, getIdle, getIdle);
  const setStatus = React.useCallback((status, options) => store.client.setStatus(status, options), [store]);
  const user = record ? record.user : store.client.user;
  return React.useMemo(() => ({ user, record, idle, setStatus }), [user, record, idle, setStatus]);
}

/**
 * Joins room `id` on mount (shared with other components in it) and leaves
 * on unmount. `state` is this device's state: joined with it, and sent again
 * (room_state) whenever its JSON changes. `token` or `getToken(room)` for a
 * room under `--room-policy token`; `onSignal(event)` for every signal
 * (no re-render). Returns the room's snapshot and its actions.
 */
function useRoom(id, options) {
  const store = useStore();
  const o = options || {};
  const latest = React.useRef(o);
  latest.current = o;
  // The entry keeps this object: it reads the newest getToken and onSignal through it.
  const live = React.useMemo(() => ({
    get state() { return latest.current.state; },
    get token() { return latest.current.token; },
    get getToken() { return latest.current.getToken; },
    onSignal: (e) => latest.current.onSignal && latest.current.onSignal(e),
  }), []);
  const subscribe = React.useCallback((l) => store.subscribeRoom(id, live, l), [store, id, live]);
  const getSnapshot = () => {
    const e = store.rooms.get(id);
    return e ? e.snapshot : NOT_JOINED;
  };
  const snapshot = React.useSyncExternalStore(subscribe, getSnapshot, getSnapshot);
  const stateJson = o.state === undefined ? undefined : JSON.stringify(o.state);
  React.useEffect(() => {
    const e = store.rooms.get(id);
    if (stateJson === undefined || !e || JSON.stringify(e.room.state) === stateJson) return;
    e.room.update(JSON.parse(stateJson));
    e.refresh();
  }, [store, id, stateJson]);
  const actions = React.useMemo(() => {
    const withRoom = (fn) => {
      const e = store.rooms.get(id);
      if (e) fn(e);
    };
    return {
      update: (state) => withRoom((e) => { e.room.update(state); e.refresh(); }),
      signal: (data) => withRoom((e) => e.room.signal(data)),
      typing: () => withRoom((e) => e.room.typing()),
      stopTyping: () => withRoom((e) => e.room.stopTyping()),
    };
  }, [store, id]);
  return React.useMemo(() => ({ ...snapshot, ...actions }), [snapshot, actions]);
}

/**
 * The user and device counts of room `id`, which it joins like useRoom
 * (sharing the join). Re-renders only when the counts change: not for
 * states, signals or typing.
 */
function useOccupancy(id) {
  const store = useStore();
  const subscribe = React.useCallback((l) => store.subscribeRoom(id, {}, l), [store, id]);
  const getSnapshot = () => {
    const e = store.rooms.get(id);
    return e ? e.counts : NO_COUNTS;
  };
  return React.useSyncExternalStore(subscribe, getSnapshot, getSnapshot);
}

module.exports = { PresenceProvider, usePresenceClient, usePresence, useSelf, useRoom, useOccupancy };
