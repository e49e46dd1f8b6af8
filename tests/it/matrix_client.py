"""A Matrix test client on matrix-nio (with E2EE through vodozemac), run by the Rust tests as a
subprocess: `python3 matrix_client.py '<json command>'` prints one JSON object on stdout
(`{"error": ...}` and exit status 1 when the command fails).

Every command names the homeserver (`hs`) and, except `register` without a store and the raw
`logout`, the user's directory (`store`): nio's crypto store and `session.json` (user id,
device id, access token), so a user keeps one device across invocations. Commands:

- register {secret, user, password}: a user through Synapse's shared-secret admin API
  (/_synapse/admin/v1/register, HMAC-SHA1 over the nonce); returns user_id, access_token,
  device_id (and keeps them in `store` when given).
- login {user_id, password}: a password login (a new device), kept in `store`.
- create_dm {invite: [user ids], encrypted, count}: a direct chat with those users invited
  (`count` of them, 1 when absent); returns room_id (the first) and room_ids.
- join {room_id}: joins a room the user was invited to.
- send {room_id, kind, ...}: kind `text` / `notice` {body}, `edit` {target, body}, `reply`
  {target, body, quoted}, `reaction` {target, key}, `image` / `file` / `audio` {path, mimetype,
  body, declared_size (the `info.size` announced, the true size when absent)}; `audio` is a
  voice message (m.audio with the voice markers). Encrypted rooms: the
  message and the uploaded media are encrypted, room keys go to every device, unverified ones
  too. Returns event_id.
- messages {room_id}: every event of the room from /messages, oldest first, decrypted where
  the keys are here (see `describe`).
- wait {room_id, sender, count, contains, timeout}: syncs until the room holds at least `count`
  m.room.message events from `sender` (whose body contains `contains`, when given); returns
  them as `events`.
- membership {room_id, user_id}: the user's membership in the room ("" when none);
  memberships {room_ids, user_id}: the same for each room, as a list.
- devices {user_id}: the user's device ids (from /keys/query).
- logout {access_token}: revokes that access token (POST /logout).
"""

import asyncio
import hashlib
import hmac
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from nio import AsyncClient, AsyncClientConfig, MegolmEvent, RoomPreset
from nio.exceptions import EncryptionError

ENCRYPTION = {
    "type": "m.room.encryption",
    "state_key": "",
    "content": {"algorithm": "m.megolm.v1.aes-sha2"},
}


class Failed(Exception):
    pass


def http(hs, method, path, token=None, body=None):
    """One client-server API request; returns the JSON answer, raises Failed on an error."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(hs.rstrip("/") + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        raise Failed(f"{method} {path}: {e.code} {e.read().decode(errors='replace')}")


def quote(s):
    return urllib.parse.quote(s, safe="")


def save_session(store, session):
    os.makedirs(store, exist_ok=True)
    with open(os.path.join(store, "session.json"), "w") as f:
        json.dump(session, f)


def register(cmd):
    hs = cmd["hs"]
    nonce = http(hs, "GET", "/_synapse/admin/v1/register")["nonce"]
    user, password = cmd["user"], cmd["password"]
    mac = hmac.new(cmd["secret"].encode(), digestmod=hashlib.sha1)
    mac.update(b"\x00".join([nonce.encode(), user.encode(), password.encode(), b"notadmin"]))
    out = http(
        hs,
        "POST",
        "/_synapse/admin/v1/register",
        body={
            "nonce": nonce,
            "username": user,
            "password": password,
            "admin": False,
            "mac": mac.hexdigest(),
        },
    )
    session = {k: out[k] for k in ("user_id", "access_token", "device_id")}
    if cmd.get("store"):
        save_session(cmd["store"], session)
    return session


def login(cmd):
    out = http(
        cmd["hs"],
        "POST",
        "/_matrix/client/v3/login",
        body={
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": cmd["user_id"]},
            "password": cmd["password"],
        },
    )
    session = {k: out[k] for k in ("user_id", "access_token", "device_id")}
    save_session(cmd["store"], session)
    return session


async def client_for(cmd):
    """The user's nio client, logged in from `store`, after one full sync (rooms and their
    members, room keys sent to this device) and with its device keys published."""
    store = cmd["store"]
    with open(os.path.join(store, "session.json")) as f:
        s = json.load(f)
    config = AsyncClientConfig(store_sync_tokens=True, encryption_enabled=True)
    client = AsyncClient(cmd["hs"], s["user_id"], device_id=s["device_id"], store_path=store, config=config)
    client.restore_login(s["user_id"], s["device_id"], s["access_token"])
    await sync(client, full_state=True)
    return client


async def sync(client, timeout=0, full_state=None):
    resp = await client.sync(timeout=timeout, full_state=full_state)
    if not hasattr(resp, "next_batch"):
        raise Failed(f"sync: {resp}")
    if client.should_upload_keys:
        await client.keys_upload()
    if client.should_query_keys:
        await client.keys_query()
    return resp


def check(resp, what):
    if type(resp).__name__.endswith("Error"):
        raise Failed(f"{what}: {resp}")
    return resp


async def create_dm(client, cmd):
    rooms = []
    for _ in range(int(cmd.get("count", 1))):
        resp = await client.room_create(
            is_direct=True,
            preset=RoomPreset.trusted_private_chat,
            invite=cmd.get("invite", []),
            initial_state=[ENCRYPTION] if cmd.get("encrypted") else [],
        )
        rooms.append(check(resp, "create the room").room_id)
    return {"room_id": rooms[0], "room_ids": rooms}


def membership(client, room_id, user_id):
    path = f"/_matrix/client/v3/rooms/{quote(room_id)}/state/m.room.member/{quote(user_id)}"
    try:
        state = http(client.homeserver, "GET", path, client.access_token)
    except Failed:
        state = {}
    return state.get("membership", "")


async def upload(client, cmd, encrypted):
    path = cmd["path"]
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        resp, keys = await client.upload(
            f,
            content_type=cmd["mimetype"],
            filename=os.path.basename(path),
            encrypt=encrypted,
            filesize=size,
        )
    uri = check(resp, "upload").content_uri
    content = {
        "body": cmd.get("body") or os.path.basename(path),
        "info": {"mimetype": cmd["mimetype"], "size": cmd.get("declared_size", size)},
    }
    if encrypted:
        content["file"] = {"url": uri, **keys}
    else:
        content["url"] = uri
    return content


async def send(client, cmd):
    room_id, kind = cmd["room_id"], cmd["kind"]
    room = client.rooms.get(room_id)
    encrypted = bool(room and room.encrypted)
    event_type = "m.room.message"
    if kind in ("text", "notice"):
        content = {"msgtype": f"m.{kind}", "body": cmd["body"]}
    elif kind == "edit":
        new = {"msgtype": "m.text", "body": cmd["body"]}
        content = {
            "msgtype": "m.text",
            "body": "* " + cmd["body"],
            "m.new_content": new,
            "m.relates_to": {"rel_type": "m.replace", "event_id": cmd["target"]},
        }
    elif kind == "reply":
        quoted = cmd.get("quoted", "")
        content = {
            "msgtype": "m.text",
            "body": f"> {quoted}\n\n{cmd['body']}" if quoted else cmd["body"],
            "m.relates_to": {"m.in_reply_to": {"event_id": cmd["target"]}},
        }
    elif kind == "reaction":
        event_type = "m.reaction"
        content = {
            "m.relates_to": {
                "rel_type": "m.annotation",
                "event_id": cmd["target"],
                "key": cmd["key"],
            }
        }
    elif kind in ("image", "file", "audio"):
        content = await upload(client, cmd, encrypted)
        content["msgtype"] = f"m.{kind}"
        if kind == "audio":
            duration = int(cmd.get("duration_ms", 3000))
            content["info"]["duration"] = duration
            content["org.matrix.msc1767.audio"] = {"duration": duration}
            content["org.matrix.msc3245.voice"] = {}
    else:
        raise Failed(f"unknown kind {kind!r}")
    resp = await client.room_send(
        room_id,
        event_type,
        content,
        tx_id=cmd.get("txn"),
        ignore_unverified_devices=True,
    )
    return {"event_id": check(resp, f"send {kind}").event_id}


def describe(client, raw):
    """One event as the tests see it: the raw type (m.room.encrypted when it was), the
    decrypted type and content, and the fields tests look at."""
    out = {
        "event_id": raw.get("event_id"),
        "sender": raw.get("sender"),
        "type": raw.get("type"),
        "encrypted": raw.get("type") == "m.room.encrypted",
        "state_key": raw.get("state_key"),
        "txn_id": raw.get("unsigned", {}).get("transaction_id"),
    }
    content = raw.get("content", {})
    kind = raw.get("type")
    if out["encrypted"]:
        try:
            dec = client.decrypt_event(MegolmEvent.from_dict(raw))
            src = getattr(dec, "source", {}) or {}
            content, kind = src.get("content", {}), src.get("type")
        except (EncryptionError, Exception) as e:  # noqa: BLE001 - reported, not fatal
            out["undecryptable"] = str(e) or type(e).__name__
            content, kind = {}, None
    out["decrypted_type"] = kind
    out["content"] = content
    out["msgtype"] = content.get("msgtype")
    out["body"] = content.get("body")
    out["formatted_body"] = content.get("formatted_body")
    out["relates_to"] = content.get("m.relates_to")
    return out


async def messages(client, room_id):
    """Every event of the room, oldest first (paging /messages backwards to the start)."""
    token = client.access_token
    raw, frm = [], None
    while True:
        q = "dir=b&limit=500" + (f"&from={quote(frm)}" if frm else "")
        page = http(client.homeserver, "GET", f"/_matrix/client/v3/rooms/{quote(room_id)}/messages?{q}", token)
        raw.extend(page.get("chunk", []))
        frm = page.get("end")
        if not frm or not page.get("chunk"):
            break
    raw.reverse()
    return [describe(client, e) for e in raw]


async def wait(client, cmd):
    deadline = time.monotonic() + float(cmd.get("timeout", 60))
    want = int(cmd.get("count", 1))
    sender, contains = cmd.get("sender"), cmd.get("contains")
    while True:
        events = [
            e
            for e in await messages(client, cmd["room_id"])
            if e["decrypted_type"] == "m.room.message" or e.get("undecryptable")
        ]
        if sender:
            events = [e for e in events if e["sender"] == sender]
        if contains:
            events = [e for e in events if contains in (e["body"] or "")]
        if len(events) >= want:
            return {"events": events}
        if time.monotonic() >= deadline:
            raise Failed(f"timed out waiting for {want} message(s) in {cmd['room_id']}: {json.dumps(events)}")
        await sync(client, timeout=1000)


async def with_client(cmd):
    client = await client_for(cmd)
    try:
        name = cmd["cmd"]
        if name == "create_dm":
            return await create_dm(client, cmd)
        if name == "join":
            check(await client.join(cmd["room_id"]), "join")
            await sync(client)
            return {"room_id": cmd["room_id"]}
        if name == "send":
            return await send(client, cmd)
        if name == "messages":
            return {"events": await messages(client, cmd["room_id"])}
        if name == "wait":
            return await wait(client, cmd)
        if name == "membership":
            return {"membership": membership(client, cmd["room_id"], cmd["user_id"])}
        if name == "memberships":
            return {"memberships": [membership(client, r, cmd["user_id"]) for r in cmd["room_ids"]]}
        if name == "devices":
            body = {"device_keys": {cmd["user_id"]: []}}
            keys = http(client.homeserver, "POST", "/_matrix/client/v3/keys/query", client.access_token, body)
            return {"devices": sorted(keys.get("device_keys", {}).get(cmd["user_id"], {}).keys())}
        raise Failed(f"unknown command {name!r}")
    finally:
        await client.close()


def main():
    cmd = json.loads(sys.argv[1])
    try:
        if cmd["cmd"] == "register":
            out = register(cmd)
        elif cmd["cmd"] == "login":
            out = login(cmd)
        elif cmd["cmd"] == "logout":
            out = http(cmd["hs"], "POST", "/_matrix/client/v3/logout", cmd["access_token"], {})
        else:
            out = asyncio.run(with_client(cmd))
    except Failed as e:
        print(json.dumps({"error": str(e)}))
        sys.exit(1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
