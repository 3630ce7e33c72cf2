//! A test transform built for WASI (wasm32-wasip1 + the preview1 adapter, plus direct
//! wasi:sockets calls) that tries everything a sandboxed transform must not be able to do:
//! read files, list a directory, read environment variables, read the clock, resolve a name,
//! open a TCP connection. It writes what happened into the first text value of every change
//! (so the test can read it) and prints a line to stdout and stderr (which the host must send
//! to its log, not to its own stdout).

wit_bindgen::generate!({
    path: "../../../wit",
    world: "transform",
});

use zipline::transform::types::{Span, Value};

fn probe() -> String {
    let mut out = Vec::new();
    out.push(match std::fs::read_to_string("/etc/passwd") {
        Ok(s) => format!("file:READ {} bytes", s.len()),
        Err(e) => format!("file:denied ({e})"),
    });
    out.push(match std::fs::read_dir(".") {
        Ok(d) => format!("dir:LISTED {} entries", d.count()),
        Err(e) => format!("dir:denied ({e})"),
    });
    let vars = std::env::vars().count();
    out.push(match std::env::var("HOME") {
        Ok(v) => format!("env:HOME={v} ({vars} vars)"),
        Err(_) => format!("env:none ({vars} vars)"),
    });
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    out.push(format!("clock:{now}"));
    out.push(match std::net::TcpStream::connect("127.0.0.1:5432") {
        Ok(_) => "std-socket:CONNECTED".to_owned(),
        Err(e) => format!("std-socket:denied ({e})"),
    });
    out.push(wasi_sockets());
    out.join("; ")
}

/// Straight to wasi:sockets, past std: create a TCP socket and connect to PostgreSQL's port,
/// and resolve a host name.
fn wasi_sockets() -> String {
    use wasi::sockets::network::{IpAddress, IpAddressFamily, IpSocketAddress, Ipv4SocketAddress};
    let network = wasi::sockets::instance_network::instance_network();
    let lookup = match wasi::sockets::ip_name_lookup::resolve_addresses(&network, "localhost") {
        Ok(_) => "lookup:STARTED".to_owned(),
        Err(e) => format!("lookup:denied ({e:?})"),
    };
    let tcp = match wasi::sockets::tcp_create_socket::create_tcp_socket(IpAddressFamily::Ipv4) {
        Err(e) => format!("tcp:denied at create ({e:?})"),
        Ok(sock) => {
            let addr = IpSocketAddress::Ipv4(Ipv4SocketAddress {
                port: 5432,
                address: (127, 0, 0, 1),
            });
            let _ = IpAddress::Ipv4((127, 0, 0, 1));
            match sock.start_connect(&network, addr) {
                Err(e) => format!("tcp:denied at connect ({e:?})"),
                Ok(()) => {
                    sock.subscribe().block();
                    match sock.finish_connect() {
                        Ok(_) => "tcp:CONNECTED".to_owned(),
                        Err(e) => format!("tcp:failed ({e:?})"),
                    }
                }
            }
        }
    };
    format!("{lookup}; {tcp}")
}

struct Component;

impl Guest for Component {
    fn init(_config: Vec<(String, String)>) -> Result<(), String> {
        Ok(())
    }

    fn transform(batch: Batch) -> Result<Output, String> {
        let report = probe();
        println!("wasi-probe stdout: {report}");
        eprintln!("wasi-probe stderr: probing done");
        // The report replaces each change's first text value: one copy in the output's data,
        // addressed after the input's.
        let report_span = Span {
            start: batch.data.len() as u32,
            len: report.len() as u32,
        };
        let mut values = batch.values;
        for c in &batch.changes {
            let row = &mut values[c.values.start as usize..][..c.values.len as usize];
            if let Some(v) = row.iter_mut().find(|v| matches!(v, Value::Text(_))) {
                *v = Value::Text(report_span);
            }
        }
        Ok(Output {
            tables: batch.tables,
            data: report.into_bytes(),
            values,
            changes: batch.changes,
            errors: Vec::new(),
        })
    }
}

export!(Component);
