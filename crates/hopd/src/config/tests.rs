//! The configuration file's checks: what is accepted, and what each error says.

use super::*;

const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

fn good() -> String {
    format!(
        "node_id = 1\nlisten = \"127.0.0.1:7000\"\n\n[[neighbours]]\nid = 2\naddress = \"127.0.0.2:7000\"\n\n[[routes]]\ndestination = 3\nnext_hop = 2\n\n[storage]\ndir = \"/tmp/x\"\n\n[security]\nmesh_key = \"{KEY}\"\n"
    )
}

#[test]
fn good_config_parses() {
    let c = Config::parse("t.toml", &good(), Path::new("/")).unwrap();
    assert_eq!(c.node_id, 1);
    assert_eq!(c.routes.get(&3), Some(&2));
    assert_eq!(c.neighbour_addr(2), Some("127.0.0.2:7000".parse().unwrap()));
    assert_eq!(c.mesh_key.unwrap()[1], 0x11);
}

#[test]
fn unknown_key_is_located() {
    let text = good().replace("[storage]\n", "[storage]\nmax_dsk = 5\n");
    let e = Config::parse("t.toml", &text, Path::new("/")).unwrap_err();
    assert!(e.message.contains("unknown field"), "{e}");
    assert_eq!(e.line, 13, "{e}");
}

#[test]
fn route_via_non_neighbour_is_rejected() {
    let text = good().replace("next_hop = 2", "next_hop = 9");
    let e = Config::parse("t.toml", &text, Path::new("/")).unwrap_err();
    assert_eq!(e.line, 10, "{e}");
    assert!(e.hint.contains("neighbours"));
}

#[test]
fn bad_key_is_rejected() {
    let text = good().replace(KEY, "abc");
    let e = Config::parse("t.toml", &text, Path::new("/")).unwrap_err();
    assert!(e.message.contains("hex"), "{e}");
}

/// IPv6 hellos and broadcast data go to multicast groups: a link-local group needs the
/// interface it is on, a unicast address is refused, and each must be in `listen`'s family.
#[test]
fn ipv6_link_wide_addresses_are_multicast_groups_on_an_interface() {
    let v6 = good()
        .replace("127.0.0.1:7000", "[::]:7000")
        .replace("127.0.0.2:7000", "[fd00::2]:7000");
    let with = |extra: &str| format!("{extra}\n{v6}");
    let c = Config::parse(
        "t.toml",
        &with("interface = \"lo\"\ndiscovery_address = \"[ff02::7470]:7000\""),
        Path::new("/"),
    )
    .unwrap();
    let Some(SocketAddr::V6(d)) = c.discovery_address else {
        panic!("{:?}", c.discovery_address)
    };
    assert_eq!(d.ip().segments()[0], 0xff02);
    assert_eq!(d.scope_id(), 1, "scoped to lo");
    let e = Config::parse(
        "t.toml",
        &with("discovery_address = \"[ff02::7470]:7000\""),
        Path::new("/"),
    )
    .unwrap_err();
    assert!(e.message.contains("link-local group"), "{e}");
    assert!(e.hint.contains("interface"), "{e}");
    let e = Config::parse(
        "t.toml",
        &with("interface = \"lo\"\ndiscovery_address = \"[fd00::ff]:7000\""),
        Path::new("/"),
    )
    .unwrap_err();
    assert!(e.message.contains("no broadcast"), "{e}");
    let e = Config::parse(
        "t.toml",
        &with("link_mode = \"broadcast\"\nbroadcast_address = \"10.0.0.255:7000\""),
        Path::new("/"),
    )
    .unwrap_err();
    assert!(e.message.contains("family"), "{e}");
    let c = Config::parse(
        "t.toml",
        &with("interface = \"lo\"\nlink_mode = \"broadcast\"\nbroadcast_address = \"[ff02::7471]:7000\""),
        Path::new("/"),
    )
    .unwrap();
    assert!(c.broadcast_address.is_some_and(|a| a.ip().is_multicast()));
}

/// With a node key the node id comes from the key; a node_id that differs is an error,
/// as is a members file without a key of this node's own, or a line that is no key.
#[test]
fn a_node_key_gives_the_node_id_and_members_need_one() {
    let dir = tempfile::tempdir().unwrap();
    let key = crate::identity::write_new_node_key(&dir.path().join("node.key")).unwrap();
    let other = crate::identity::NodeKey::from_seed(&[5; 32]).unwrap();
    std::fs::write(
        dir.path().join("members"),
        format!(
            "{} a\n{} b\n",
            crate::identity::hex(key.public()),
            crate::identity::hex(other.public())
        ),
    )
    .unwrap();
    let base = good().replacen("node_id = 1\n", "", 1);
    let with = |top: &str, sec: &str| {
        format!(
            "{top}{}",
            base.replace("[security]\n", &format!("[security]\n{sec}"))
        )
    };
    let c = Config::parse(
        "t.toml",
        &with(
            "",
            "node_key_file = \"node.key\"\nmembers_file = \"members\"\n",
        ),
        dir.path(),
    )
    .unwrap();
    assert_eq!(c.node_id, key.node_id());
    let m = c.members.unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!(m[1].id, other.node_id());
    let e = Config::parse(
        "t.toml",
        &with(
            &format!("node_id = {}\n", key.node_id() ^ 1),
            "node_key_file = \"node.key\"\n",
        ),
        dir.path(),
    )
    .unwrap_err();
    assert!(e.message.contains("not the id of this node's key"), "{e}");
    assert_eq!(e.line, 1, "{e}");
    let e = Config::parse(
        "t.toml",
        &with("node_id = 1\n", "members_file = \"members\"\n"),
        dir.path(),
    )
    .unwrap_err();
    assert!(e.hint.contains("hop keygen"), "{e}");
    let e = Config::parse("t.toml", &with("", ""), dir.path()).unwrap_err();
    assert!(e.message.contains("needs an id"), "{e}");
    std::fs::write(dir.path().join("members"), "nonsense\n").unwrap();
    let e = Config::parse(
        "t.toml",
        &with(
            "",
            "node_key_file = \"node.key\"\nmembers_file = \"members\"\n",
        ),
        dir.path(),
    )
    .unwrap_err();
    assert!(e.message.contains("members:1"), "{e}");
}

/// Sessions replace the mesh key: they need the node's key and a members file, and a mesh
/// key beside them is an error, not silently ignored.
#[test]
fn sessions_need_keys_and_members_and_no_mesh_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = crate::identity::write_new_node_key(&dir.path().join("node.key")).unwrap();
    std::fs::write(
        dir.path().join("members"),
        format!("{} a\n", crate::identity::hex(key.public())),
    )
    .unwrap();
    let base = good().replacen("node_id = 1\n", "", 1);
    let mesh = format!("mesh_key = \"{KEY}\"\n");
    let with = |sec: &str, keep_mesh: bool| {
        let b = if keep_mesh {
            base.clone()
        } else {
            base.replace(&mesh, "")
        };
        b.replace("[security]\n", &format!("[security]\n{sec}"))
    };
    let keys = "node_key_file = \"node.key\"\nmembers_file = \"members\"\n";
    let c = Config::parse(
        "t.toml",
        &with(&format!("{keys}sessions = true\n"), false),
        dir.path(),
    )
    .unwrap();
    assert!(c.sessions);
    assert_eq!(c.mesh_key, None);
    let e = Config::parse(
        "t.toml",
        &with(&format!("{keys}sessions = true\n"), true),
        dir.path(),
    )
    .unwrap_err();
    assert!(e.message.contains("sessions replace the mesh key"), "{e}");
    let e = Config::parse(
        "t.toml",
        &with("node_key_file = \"node.key\"\nsessions = true\n", false),
        dir.path(),
    )
    .unwrap_err();
    assert!(e.message.contains("members file"), "{e}");
    let e = Config::parse("t.toml", &with(keys, false), dir.path()).unwrap_err();
    assert!(e.message.contains("or sessions"), "{e}");
}

/// A node on several links lists each link's broadcast address; the list needs the
/// wildcard listen address and excludes `discovery_address`.
#[test]
fn discovery_addresses_list_every_link() {
    let base = good()
        .replace("listen = \"127.0.0.1:7000\"", "listen = \"0.0.0.0:7000\"")
        .replace(
            "node_id = 1\n",
            "node_id = 1\ndiscovery_addresses = [\"10.1.0.255:7000\", \"10.2.0.255:7000\"]\n",
        );
    let c = Config::parse("t.toml", &base, Path::new("/")).unwrap();
    assert_eq!(c.discovery_addresses.len(), 2);
    assert_eq!(
        c.discovery_address,
        Some("10.1.0.255:7000".parse().unwrap())
    );
    let e = Config::parse(
        "t.toml",
        &base.replace("0.0.0.0:7000", "10.1.0.1:7000"),
        Path::new("/"),
    )
    .unwrap_err();
    assert!(e.message.contains("wildcard"), "{e}");
    let e = Config::parse(
        "t.toml",
        &base.replace(
            "node_id = 1\n",
            "node_id = 1\ndiscovery_address = \"10.1.0.255:7000\"\n",
        ),
        Path::new("/"),
    )
    .unwrap_err();
    assert!(e.message.contains("both"), "{e}");
}

#[test]
fn every_transport_name_parses() {
    for kind in TransportKind::ALL {
        let text = format!("transport = \"{}\"\n{}", kind.name(), good());
        let c = Config::parse("t.toml", &text, Path::new("/")).unwrap();
        assert_eq!(c.transport, kind);
    }
    let c = Config::parse("t.toml", &good(), Path::new("/")).unwrap();
    assert_eq!(c.transport, TransportKind::Hop);
}

#[test]
fn unknown_transport_lists_the_choices() {
    let text = format!("transport = \"atp_adaptive\"\n{}", good());
    let e = Config::parse("t.toml", &text, Path::new("/")).unwrap_err();
    assert_eq!(e.line, 1, "{e}");
    for kind in TransportKind::ALL {
        assert!(e.message.contains(kind.name()), "{e}");
    }
}

#[test]
fn link_status_is_off_by_default_and_its_limit_is_checked() {
    let c = Config::parse("t.toml", &good(), Path::new("/")).unwrap();
    assert_eq!(c.link_status_socket, None);
    let text = format!("link_status_socket = \"/run/l.sock\"\n{}", good());
    let c = Config::parse("t.toml", &text, Path::new("/")).unwrap();
    assert_eq!(c.link_status_socket, Some(PathBuf::from("/run/l.sock")));
    assert_eq!(c.link_queue_frames, crate::linkstatus::DEFAULT_QUEUE_FRAMES);
    let text = format!(
        "link_status_socket = \"/run/l.sock\"\nlink_queue_frames = 0\n{}",
        good()
    );
    let e = Config::parse("t.toml", &text, Path::new("/")).unwrap_err();
    assert_eq!(e.line, 2, "{e}");
    assert!(e.message.contains("out of range"), "{e}");
    let text = format!("link_queue_frames = 8\n{}", good());
    let e = Config::parse("t.toml", &text, Path::new("/")).unwrap_err();
    assert!(e.message.contains("needs link_status_socket"), "{e}");
}

#[test]
fn control_when_full_is_read_and_needs_link_status() {
    let c = Config::parse("t.toml", &good(), Path::new("/")).unwrap();
    assert_eq!(c.link_control_when_full, DEFAULT_LINK_CONTROL_WHEN_FULL);
    let flip = !DEFAULT_LINK_CONTROL_WHEN_FULL;
    let text = format!(
        "link_status_socket = \"/run/l.sock\"\nlink_control_when_full = {flip}\n{}",
        good()
    );
    let c = Config::parse("t.toml", &text, Path::new("/")).unwrap();
    assert_eq!(c.link_control_when_full, flip);
    let text = format!("link_control_when_full = {flip}\n{}", good());
    let e = Config::parse("t.toml", &text, Path::new("/")).unwrap_err();
    assert_eq!(e.line, 1, "{e}");
    assert!(e.message.contains("needs link_status_socket"), "{e}");
}

#[test]
fn dscps_default_to_voice_and_background_and_are_checked() {
    let c = Config::parse("t.toml", &good(), Path::new("/")).unwrap();
    assert_eq!((c.control_dscp, c.data_dscp), (DSCP_EF, DSCP_CS1));
    let text = format!("control_dscp = 0\ndata_dscp = 10\n{}", good());
    let c = Config::parse("t.toml", &text, Path::new("/")).unwrap();
    assert_eq!((c.control_dscp, c.data_dscp), (0, 10));
    let text = format!(
        "node_id = 1\ncontrol_dscp = 64\n{}",
        good().replacen("node_id = 1\n", "", 1)
    );
    let e = Config::parse("t.toml", &text, Path::new("/")).unwrap_err();
    assert_eq!(e.line, 2, "{e}");
    assert!(e.message.contains("not a DSCP"), "{e}");
}

#[test]
fn line_col_counts_from_one() {
    assert_eq!(line_col("ab\ncd", 0), (1, 1));
    assert_eq!(line_col("ab\ncd", 4), (2, 2));
}

#[test]
fn the_cipher_defaults_to_auto_and_an_unknown_one_is_located() {
    use crate::auth::{Cipher, CipherSetting};
    let c = Config::parse("t.toml", &good(), Path::new("/")).unwrap();
    assert_eq!(c.cipher, CipherSetting::Auto);
    let by_cpu = if crate::auth::hardware_aes() {
        Cipher::Aes256Gcm
    } else {
        Cipher::ChaCha20Poly1305
    };
    assert_eq!(c.cipher.resolve(), by_cpu);
    for (name, cipher) in [
        ("aes-256-gcm", Cipher::Aes256Gcm),
        ("chacha20-poly1305", Cipher::ChaCha20Poly1305),
    ] {
        let text = format!("{}cipher = \"{name}\"\n", good());
        let c = Config::parse("t.toml", &text, Path::new("/")).unwrap();
        assert_eq!(c.cipher.resolve(), cipher);
        assert_eq!(cipher.name(), name);
    }
    let text = format!("{}cipher = \"aes\"\n", good());
    let e = Config::parse("t.toml", &text, Path::new("/")).unwrap_err();
    assert_eq!(e.line, 17, "{e}");
    for name in ["auto", "chacha20-poly1305", "aes-256-gcm"] {
        assert!(e.message.contains(name), "{e}");
    }
}

#[test]
fn deliveries_are_written_on_the_spool_thread_unless_it_is_turned_off() {
    let c = Config::parse("t.toml", &good(), Path::new("/")).unwrap();
    assert!(c.spool_thread);
    let text = good().replace("[storage]\n", "[storage]\nspool_thread = false\n");
    let c = Config::parse("t.toml", &text, Path::new("/")).unwrap();
    assert!(!c.spool_thread);
}

#[test]
fn the_custody_write_delay_defaults_to_a_second_and_is_checked() {
    let c = Config::parse("t.toml", &good(), Path::new("/")).unwrap();
    assert_eq!(c.custody_write_delay, DEFAULT_CUSTODY_WRITE_DELAY);
    for (v, want) in [("0s", 0), ("0", 0), ("250ms", 250)] {
        let text = good().replace(
            "[storage]\n",
            &format!("[storage]\ncustody_write_delay = \"{v}\"\n"),
        );
        let c = Config::parse("t.toml", &text, Path::new("/")).unwrap();
        assert_eq!(
            c.custody_write_delay,
            std::time::Duration::from_millis(want)
        );
    }
    for bad in ["soon", "2h"] {
        let text = good().replace(
            "[storage]\n",
            &format!("[storage]\ncustody_write_delay = \"{bad}\"\n"),
        );
        let e = Config::parse("t.toml", &text, Path::new("/")).unwrap_err();
        assert!(e.message.contains("custody_write_delay"), "{e}");
        assert_eq!(e.line, 13, "{e}");
    }
}
