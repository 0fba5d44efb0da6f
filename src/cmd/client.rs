//! `warden status`, `halt`, `send`, `events`, `unlock`, `pause`, `resume`, `clear`, `ask`: one
//! call of the admin API ([`warden::cli::client`]).

use std::process::ExitCode;

/// Where the server is and how to authenticate.
#[derive(clap::Args)]
pub(crate) struct ServerArgs {
    /// The server: http://HOST:PORT, https://HOST:PORT, or HOST:PORT for http [env: WARDEN_URL;
    /// default: http://127.0.0.1:7878].
    #[arg(long)]
    pub(crate) url: Option<String>,
    /// Bearer token [default: WARDEN_ADMIN_TOKEN, then WARDEN_READ_TOKEN for status and ask].
    #[arg(long)]
    pub(crate) token: Option<String>,
}

/// Runs one client command against a running server; prints one `error:` line on failure.
pub(crate) fn client(server: ServerArgs, call: warden::cli::client::Call) -> ExitCode {
    let env = |name: &str| std::env::var(name).ok();
    let url = server
        .url
        .or_else(|| env("WARDEN_URL").filter(|u| !u.is_empty()))
        .unwrap_or_else(|| warden::cli::client::DEFAULT_URL.to_owned());
    let token = warden::cli::client::token_for(server.token, call.read_only(), env);
    let result = actix_rt::System::new().block_on(async move {
        let client = warden::cli::client::Client::new(&url, token)?;
        let mut stdout = std::io::stdout();
        warden::cli::client::run(&client, call, &mut stdout).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`warden events -f | head`): not an error worth a word.
        Err(warden::cli::client::ClientError::Output(e))
            if e.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

/// `warden ask`: the pending asks, or the answer to ask `id`.
pub(crate) fn ask(
    server: ServerArgs,
    id: Option<u64>,
    answer: Option<String>,
    note: Option<String>,
    json: bool,
) -> ExitCode {
    let call = match (id, answer) {
        (Some(id), Some(answer)) => warden::cli::client::Call::Answer { id, answer, note },
        (Some(_), None) => {
            eprintln!("error: warden ask ID needs an answer: yes or no");
            return ExitCode::from(2);
        }
        (None, _) => warden::cli::client::Call::Asks { json },
    };
    client(server, call)
}
